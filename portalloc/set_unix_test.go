//go:build unix

package portalloc_test

// Tests that need Unix: process groups, signals to a pid, and socket
// hand-off through ExtraFiles.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/listenfd"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

func init() {
	workers["set"] = func(ctx context.Context) error { return setWorker(ctx, "set") }
	workers["orch"] = func(ctx context.Context) error { return setWorker(ctx, "orch") }
	workers["serve"] = func(context.Context) error { return serveInherited() }
}

// setWorker allocates the set in BERTH_TEST_SPEC on BERTH_TEST_RANGE, prints
// its manifest and holds it. As "orch" it also starts a sleeper child for
// each member, hands it the member's ports with their locks, and prints
// the child's pid.
func setWorker(ctx context.Context, mode string) error {
	r, err := store.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
	if err != nil {
		return err
	}
	cfg := workerConfig()
	cfg.Range, cfg.AllowEphemeralOverlap = r, true
	a, err := portalloc.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	spec, err := portset.ParseSetSpec([]byte(os.Getenv("BERTH_TEST_SPEC")))
	if err != nil {
		return err
	}
	_, _ = os.Stdin.Read(make([]byte, 1)) // start together
	set, err := portset.Allocate(ctx, a, spec)
	if err != nil {
		return err
	}
	if mode == "orch" {
		for _, m := range set.Members() {
			// A worker has no testing.TB for testproc.Command: it names
			// the child's role itself.
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(append(os.Environ(), testproc.EnvRole+"=sleeper"), m.Env()...)
			child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // outlives us
			if child.ExtraFiles, err = m.Files(); err != nil {
				return err
			}
			err := child.Start()
			for _, f := range child.ExtraFiles {
				_ = f.Close()
			}
			if err != nil {
				return err
			}
			if err := set.Transfer(ctx, m, child.Process.Pid); err != nil {
				return err
			}
			fmt.Printf("child %d\n", child.Process.Pid)
		}
	}
	b, _ := json.Marshal(set.Manifest())
	fmt.Println(string(b))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

type setProc struct {
	*proc
	children []int
	manifest portset.Manifest
}

func startSetWorker(tb testing.TB, mode, dir, rng string, spec portset.SetSpec) *setProc {
	tb.Helper()
	js, _ := json.Marshal(spec)
	return &setProc{proc: spawn(tb, mode, "BERTH_STATE_DIR="+dir, "BERTH_TEST_RANGE="+rng, "BERTH_TEST_SPEC="+string(js))}
}

func (p *setProc) read(tb testing.TB) {
	tb.Helper()
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			tb.Fatalf("set worker pid %d ended: %v", p.cmd.Process.Pid, err)
		}
		if pid, ok := strings.CutPrefix(strings.TrimSpace(line), "child "); ok {
			n, _ := strconv.Atoi(pid)
			p.children = append(p.children, n)
			continue
		}
		if err := json.Unmarshal([]byte(line), &p.manifest); err != nil {
			tb.Fatalf("set worker said %q", line)
		}
		return
	}
}

func manifestPorts(m portset.Manifest) []uint16 {
	var out []uint16
	for _, mem := range m.Members {
		for _, p := range mem.Ports {
			if !slices.Contains(out, p.Port) {
				out = append(out, p.Port)
			}
		}
	}
	return out
}

// TestSetsAcrossProcesses: two processes allocate sets from one 100-port
// range at once and get no port in common; once one is SIGKILLed, a set
// that needs its ports gets them, after reaping.
func TestSetsAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	base := freeRun(t, 100)
	rng := fmt.Sprintf("%d-%d", base, base+99)
	spec := func(name string, n int) portset.SetSpec {
		return portset.SetSpec{Name: name, Groups: []portset.GroupSpec{{Name: "svc", Members: n, Ports: []portset.PortSpec{{Name: "http"}, {Name: "admin", Shared: true}}}}}
	}
	p1 := startSetWorker(t, "set", dir, rng, spec("one", 39)) // 40 ports each
	p2 := startSetWorker(t, "set", dir, rng, spec("two", 39))
	_, _ = p1.stdin.Write([]byte{1})
	_, _ = p2.stdin.Write([]byte{1})
	p1.read(t)
	p2.read(t)
	ports1, ports2 := manifestPorts(p1.manifest), manifestPorts(p2.manifest)
	if len(ports1) != 40 || len(ports2) != 40 {
		t.Fatalf("the sets have %d and %d ports; want 40 each", len(ports1), len(ports2))
	}
	for _, p := range ports1 {
		if slices.Contains(ports2, p) {
			t.Errorf("port %d is in both sets", p)
		}
	}
	r, _ := store.ParseRange(rng)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: r, AllowEphemeralOverlap: true})
	if _, err := portset.Allocate(context.Background(), a, spec("three", 59)); !errors.Is(err, store.ErrExhausted) {
		t.Fatalf("a 60-port set beside 80 held ports = %v; want ErrExhausted", err)
	}
	p1.kill(t)
	set, err := portset.Allocate(context.Background(), a, spec("three", 59))
	if err != nil {
		t.Fatalf("a 60-port set after the holder of 40 was killed = %v", err)
	}
	got := manifestPorts(set.Manifest())
	for _, p := range got {
		if slices.Contains(ports2, p) {
			t.Errorf("port %d of the live set was handed out again", p)
		}
	}
	// The dead set's rows are gone: reaped by this Allocator on its way, or
	// by another process's background sweep that ran after the kill.
	rows := storeRows(t, dir, store.Filter{})
	for _, row := range rows {
		if row.Owner.PID == p1.cmd.Process.Pid {
			t.Errorf("%v is still held by the killed set's process", row.Key)
		}
	}
	if len(rows) != 100 {
		t.Errorf("%d rows after the third set; want 100 (the live set's 40 and the new set's 60)", len(rows))
	}
}

// TestOrchestratorCrash: an orchestrator allocates a set, starts a child
// per member, hands each its ports and is SIGKILLed. The ports stay
// reserved while the child lives and are free once it has exited.
func TestOrchestratorCrash(t *testing.T) {
	dir := t.TempDir()
	base := freeRun(t, 100)
	orch := startSetWorker(t, "orch", dir, fmt.Sprintf("%d-%d", base, base+99), portset.SetSpec{Name: "app", Groups: []portset.GroupSpec{{Name: "svc", Ports: []portset.PortSpec{{Name: "http"}}}}})
	_, _ = orch.stdin.Write([]byte{1})
	orch.read(t)
	if len(orch.children) != 1 {
		t.Fatalf("children = %v; want one", orch.children)
	}
	child := orch.children[0]
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	port := orch.manifest.Members[0].Ports["http"].Port

	orch.kill(t)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	_, err := a.Reserve(context.Background(), portalloc.Request{}, port)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != child {
		t.Fatalf("Reserve(%d) after the orchestrator died = %v; want held by the child pid %d", port, err, child)
	}
	if err := syscall.Kill(child, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := a.Reserve(context.Background(), portalloc.Request{}, port)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Reserve(%d) 10s after the child died = %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serveInherited serves HTTP on the listener it was handed, without
// binding anything itself, and says who it is.
func serveInherited() error {
	pid, fds := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS")
	in, err := listenfd.Inherit()
	if err != nil {
		return err
	}
	l, ok := in.Listeners["http"]
	if !ok {
		return fmt.Errorf("no inherited listener named http (LISTEN_PID=%s)", pid)
	}
	return http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Inherit unset LISTEN_*, so this process's own children
		// would not take the sockets for theirs.
		fmt.Fprintf(w, "pid %d LISTEN_PID %s LISTEN_FDS %s now %q", os.Getpid(), pid, fds, os.Getenv("LISTEN_FDS"))
	}))
}

// TestListenerHandoff: the parent allocates a port already listening and
// hands the socket, and the port's lock, to a child, which serves HTTP on
// it without binding. Through the sh wrapper the child's pid stays the same
// and LISTEN_PID is set to it.
func TestListenerHandoff(t *testing.T) {
	pid, body := handOffAndAsk(t, listenfd.Handoff{})
	want := fmt.Sprintf("pid %d LISTEN_PID %d LISTEN_FDS 1 now \"\"", pid, pid)
	if body != want {
		t.Errorf("child said %q; want %q (the sh wrapper keeps the pid and sets LISTEN_PID)", body, want)
	}
}

// TestListenerHandoffNoPIDWrapper: without the wrapper the child runs
// directly with no LISTEN_PID, and Inherit still takes the socket.
func TestListenerHandoffNoPIDWrapper(t *testing.T) {
	pid, body := handOffAndAsk(t, listenfd.Handoff{NoPIDWrapper: true})
	if want := fmt.Sprintf("pid %d LISTEN_PID  LISTEN_FDS 1 now \"\"", pid); body != want {
		t.Errorf("child said %q; want %q", body, want)
	}
}

// handOffAndAsk allocates a listening port, hands it and its lock to a
// "serve" child through h, gives the child the reservation, and returns
// the child's pid and its answer over HTTP.
func handOffAndAsk(tb testing.TB, h listenfd.Handoff) (int, string) {
	tb.Helper()
	ctx := context.Background()
	a := newAllocator(tb, portalloc.Config{Mode: portalloc.ModeStateStore})
	r, ln, err := a.Listen(ctx, portalloc.Request{Label: "web"})
	if err != nil {
		tb.Fatal(err)
	}
	// The port is taken from the moment Listen returns.
	if bindable(tb, r) {
		tb.Fatal("the allocated port was not bound")
	}
	if err := h.Add("http", ln); err != nil {
		tb.Fatal(err)
	}
	locks, err := a.Files(r)
	if err != nil {
		tb.Fatal(err)
	}
	h.AddLocks(locks)
	cmd := testproc.Command(tb, "serve")
	cmd.Stderr = os.Stderr
	if err := h.Apply(cmd); err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := a.Transfer(ctx, r, cmd.Process.Pid); err != nil {
		tb.Fatal(err)
	}
	_ = h.Close()
	_ = ln.Close() // the parent's copies; the child's socket stays open

	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + r.AddrPort().String() + "/")
	if err != nil {
		tb.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if runtime.GOOS == "linux" {
		// The child holds the lock itself: no keeper, not this process.
		if got := lockPIDs(tb, r); !slices.Equal(got, []int{cmd.Process.Pid}) {
			tb.Errorf("the lock of %v is held by %v; want the child %d alone", r, got, cmd.Process.Pid)
		}
	}
	return cmd.Process.Pid, string(body)
}

// lockPIDs returns the processes that hold the kernel lock of r's key, as
// portlock.List sees them, sorted.
func lockPIDs(tb testing.TB, r store.Reservation) []int {
	tb.Helper()
	held, err := portlock.List()
	if err != nil {
		tb.Fatalf("portlock.List: %v", err)
	}
	var pids []int
	for _, h := range held {
		if h.Network == string(r.Protocol) && h.Port == r.Port && (h.Addr == r.Addr || !h.Addr.IsValid() && r.Addr.IsUnspecified()) {
			pids = append(pids, h.PIDs...)
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids)
}

// TestInheritGuards: sockets meant for another process, or a malformed
// count, are not taken; the variables are unset either way.
func TestInheritGuards(t *testing.T) {
	t.Setenv("LISTEN_FDS", "1")
	t.Setenv("LISTEN_PID", "1") // init's, not ours
	t.Setenv("LISTEN_FDNAMES", "http")
	in, err := listenfd.Inherit()
	if err != nil || len(in.Listeners) != 0 || len(in.PacketConns) != 0 {
		t.Errorf("Inherit for another pid = %+v, %v; want nothing", in, err)
	}
	for _, k := range []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%q left set", k, v)
		}
	}
	for _, bad := range []string{"x", "-1", "99999"} {
		t.Setenv("LISTEN_FDS", bad)
		if _, err := listenfd.Inherit(); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Inherit with LISTEN_FDS=%q = %v; want ErrInvalid", bad, err)
		}
	}
}

// TestInheritLeavesOtherDescriptors: with LISTEN_FDS set and no
// LISTEN_PID, a descriptor in the range that is not a socket (here a plain
// file at descriptor 3) is named in the error and left open, and the
// sockets after it are taken.
func TestInheritLeavesOtherDescriptors(t *testing.T) {
	plain, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lf, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()

	cmd := testproc.Command(t, "inherit")
	cmd.Env = append(cmd.Env, "LISTEN_FDS=2", "LISTEN_FDNAMES=config:web")
	cmd.ExtraFiles = []*os.File{plain, lf}
	cmd.Stderr = os.Stderr
	rep := runInherit(t, cmd)
	if len(rep.Listeners) != 1 || rep.Listeners[0] != "web" || len(rep.Packets) != 0 {
		t.Errorf("Inherit took listeners %v, packet conns %v; want the listener web only", rep.Listeners, rep.Packets)
	}
	if !strings.Contains(rep.Error, "descriptor 3") || !strings.Contains(rep.Error, "not a socket") {
		t.Errorf("Inherit error = %q; want it to name descriptor 3 as not a socket", rep.Error)
	}
	if !rep.FD3Open {
		t.Error("Inherit closed descriptor 3, which it did not take")
	}
}

// runInherit runs cmd, an "inherit" worker, and returns its report.
func runInherit(tb testing.TB, cmd *exec.Cmd) inheritReport {
	tb.Helper()
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("worker: %v", err)
	}
	var rep inheritReport
	if err := json.Unmarshal(out, &rep); err != nil {
		tb.Fatalf("worker said %q: %v", out, err)
	}
	return rep
}

// inheritReport is what an "inherit" worker reports.
type inheritReport struct {
	Listeners []string
	Packets   []string
	Error     string
	FD3Open   bool // descriptor 3 is still open after the call
}

func init() {
	// inherit takes what it was handed with listenfd.Inherit and reports
	// it, as an inheritReport.
	workers["inherit"] = func(context.Context) error {
		in, err := listenfd.Inherit()
		var rep inheritReport
		for name, l := range in.Listeners {
			rep.Listeners = append(rep.Listeners, name)
			_ = l.Close()
		}
		for name, c := range in.PacketConns {
			rep.Packets = append(rep.Packets, name)
			_ = c.Close()
		}
		if err != nil {
			rep.Error = err.Error()
		}
		var st syscall.Stat_t
		rep.FD3Open = syscall.Fstat(3, &st) == nil
		return json.NewEncoder(os.Stdout).Encode(rep)
	}
}

// TestPacketConnHandoff: a UDP socket added with AddPacketConn reaches the
// child as a packet conn under its name, beside a listener; a packet conn
// without a descriptor is refused with a *store.FieldError.
func TestPacketConnHandoff(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	_, c, err := a.ListenPacket(ctx, portalloc.Request{Label: "dns"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, ln, err := a.Listen(ctx, portalloc.Request{Label: "web"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var h listenfd.Handoff
	defer h.Close()
	if err := h.Add("web", ln); err != nil {
		t.Fatal(err)
	}
	if err := h.AddPacketConn("dns", c); err != nil {
		t.Fatal(err)
	}
	var fe *store.FieldError
	if err := h.AddPacketConn("other", noFile{c}); !errors.As(err, &fe) || fe.Field != "packet conn" {
		t.Errorf("AddPacketConn of a conn without a descriptor = %v; want a *store.FieldError for the packet conn", err)
	}
	cmd := testproc.Command(t, "inherit")
	cmd.Stderr = os.Stderr
	if err := h.Apply(cmd); err != nil {
		t.Fatal(err)
	}
	rep := runInherit(t, cmd)
	if !slices.Equal(rep.Listeners, []string{"web"}) || !slices.Equal(rep.Packets, []string{"dns"}) || rep.Error != "" {
		t.Errorf("the child took listeners %v, packet conns %v (error %q); want web and dns", rep.Listeners, rep.Packets, rep.Error)
	}
}

// noFile is a packet conn without a descriptor to pass.
type noFile struct{ net.PacketConn }
