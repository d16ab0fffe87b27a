package portalloc_test

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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
)

// apiWebSpec is the set of the issue: api with 3 members, each with its own
// http port and a shared grpc port; web with one member that refers to the
// shared grpc port and to member 0's http port.
func apiWebSpec() portalloc.SetSpec {
	return portalloc.SetSpec{Name: "dev", Groups: []portalloc.GroupSpec{
		{Name: "api", Members: 3, Ports: []portalloc.PortSpec{
			{Name: "http"},
			{Name: "grpc", Scope: portalloc.ScopeGroup},
		}},
		{Name: "web", Ports: []portalloc.PortSpec{{Name: "http"}}, Refs: []portalloc.RefSpec{
			{Env: "API_GRPC", To: "api.grpc"},
			{Env: "API_PRIMARY_HTTP", To: "api.0.http"},
		}},
	}}
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestAllocateSet(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	set, err := a.AllocateSet(ctx, apiWebSpec())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(set.Members()); n != 4 {
		t.Fatalf("%d members; want 4", n)
	}
	https := map[uint16]bool{}
	grpc := set.Member("api", 0).Ports["grpc"].Port
	for i := range 3 {
		m := set.Member("api", i)
		https[m.Ports["http"].Port] = true
		if m.Ports["grpc"].Port != grpc {
			t.Errorf("api.%d grpc = %d; want the shared %d", i, m.Ports["grpc"].Port, grpc)
		}
		env := envMap(m.Env())
		if env["API_HTTP_PORT"] != strconv.Itoa(int(m.Ports["http"].Port)) || env["API_GRPC_PORT"] != strconv.Itoa(int(grpc)) {
			t.Errorf("api.%d env = %v", i, m.Env())
		}
	}
	if len(https) != 3 || https[grpc] {
		t.Errorf("api http ports %v and grpc %d; want 3 distinct http ports apart from grpc", https, grpc)
	}
	web := set.Member("web", 0)
	env := envMap(web.Env())
	if env["API_GRPC"] != strconv.Itoa(int(grpc)) || env["API_PRIMARY_HTTP"] != strconv.Itoa(int(set.Member("api", 0).Ports["http"].Port)) {
		t.Errorf("web env = %v; want refs to api.grpc=%d and api.0.http", web.Env(), grpc)
	}
	if env["WEB_HTTP_PORT"] != strconv.Itoa(int(web.Ports["http"].Port)) {
		t.Errorf("web env = %v; want WEB_HTTP_PORT", web.Env())
	}
	// Every port was bind-probed and is bindable now.
	for _, m := range set.Members() {
		for _, r := range m.Ports {
			_ = listen(t, r.Address, r.Port).Close()
		}
	}
	man, _ := json.Marshal(set.Manifest())
	if !strings.Contains(string(man), `"scope":"group"`) || !strings.Contains(string(man), `"label":"dev/api/0/http"`) {
		t.Errorf("manifest %s lacks scopes or labels", man)
	}

	// Idempotent: again, and from a second Allocator of this process.
	again, err := a.AllocateSet(ctx, apiWebSpec())
	if err != nil || again.Member("api", 2).Ports["http"] != set.Member("api", 2).Ports["http"] {
		t.Errorf("AllocateSet again = %v; want the same ports", err)
	}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: a.Config().StateDir})
	other, err := b.AllocateSet(ctx, apiWebSpec())
	if err != nil || other.Member("web", 0).Ports["http"] != web.Ports["http"] {
		t.Errorf("AllocateSet from another Allocator = %v; want the same ports", err)
	}

	if err := set.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Errorf("second Release = %v; want nil", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Errorf("Release of rows already gone = %v; want nil", err)
	}
	if got := rowsLabelled(t, a.Config().StateDir, "dev/"); len(got) != 0 {
		t.Errorf("rows after Release: %v", got)
	}
}

func rowsLabelled(t *testing.T, dir, prefix string) []statestore.Reservation {
	t.Helper()
	s, err := statestore.Open(context.Background(), dir+"/berth.db", statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.List(context.Background(), statestore.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []statestore.Reservation
	for _, r := range rows {
		if strings.HasPrefix(r.Label, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// TestAllocateSetAtomic: when a fixed port is held by another process, the
// set fails and none of its ports stay reserved.
func TestAllocateSetAtomic(t *testing.T) {
	dir := t.TempDir()
	busy := freeRun(t, 1)
	holdInWorker(t, dir, lo4, busy)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	spec := apiWebSpec()
	spec.Groups = append(spec.Groups, portalloc.GroupSpec{Name: "db", Ports: []portalloc.PortSpec{{Name: "pg", Port: busy}}})
	_, err := a.AllocateSet(context.Background(), spec)
	if !errors.Is(err, portalloc.ErrPortHeld) {
		t.Fatalf("AllocateSet with a held fixed port = %v; want ErrPortHeld", err)
	}
	if got := rowsLabelled(t, dir, "dev/"); len(got) != 0 {
		t.Errorf("a failed set left %d rows: %v", len(got), got)
	}
	if len(a.Held()) != 0 {
		t.Errorf("Held() = %v; want none", a.Held())
	}
}

func TestSetSpecValidation(t *testing.T) {
	port := func(name string) portalloc.PortSpec { return portalloc.PortSpec{Name: name} }
	group := func(name string, ps ...portalloc.PortSpec) portalloc.GroupSpec {
		return portalloc.GroupSpec{Name: name, Ports: ps}
	}
	tests := []struct {
		name  string
		spec  portalloc.SetSpec
		field string
		want  string
	}{
		{"no set name", portalloc.SetSpec{Groups: []portalloc.GroupSpec{group("a", port("p"))}}, "name", "empty"},
		{"no groups", portalloc.SetSpec{Name: "s"}, "groups", "at least one group"},
		{"empty group name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("", port("p"))}}, "groups[0].name", "empty"},
		{"duplicate group", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("p")), group("a", port("q"))}}, "groups[1].name", "duplicate group"},
		{"dotted name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a.b", port("p"))}}, "groups[0].name", "'.'"},
		{"numeric name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("0"))}}, "groups[0].ports[0].name", "is a number"},
		{"empty port name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port(""))}}, "groups[0].ports[0].name", "empty"},
		{"duplicate port", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("p"), port("p"))}}, "groups[0].ports[1].name", "duplicate port"},
		{"no ports", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a")}}, "groups[0].ports", "at least one"},
		{"negative members", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: -1, Ports: []portalloc.PortSpec{port("p")}}}}, "groups[0].members", "want 1 to"},
		{"unknown scope", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Scope: "cluster"})}}, "groups[0].ports[0].scope", `"cluster"`},
		{"unknown protocol", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Protocol: "sctp"})}}, "groups[0].ports[0].protocol", `"sctp"`},
		{"duplicate env", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p"}, portalloc.PortSpec{Name: "q", Env: "A_P_PORT"})}}, "groups[0].ports[1].env", "duplicate environment variable"},
		{"env clashes with ref", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "A_P_PORT", To: "a.p"}}}}}, "groups[0].refs[0].env", "duplicate environment variable"},
		{"bad env name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Env: "1X"})}}, "groups[0].ports[0].env", "not a valid environment variable name"},
		{"fixed member port, 2 members", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: 2, Ports: []portalloc.PortSpec{{Name: "p", Port: 25000}}}}}, "groups[0].ports[0].port", "cannot be member-scoped"},
		{"malformed ref", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a"}}}}}, "groups[0].refs[0].to", `want "group.port"`},
		{"dangling group", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "b.p"}}}}}, "groups[0].refs[0].to", `no group "b"`},
		{"dangling port", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a.q"}}}}}, "groups[0].refs[0].to", `has no port "q"`},
		{"dangling member", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: 2, Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a.2.p"}}}}}, "groups[0].refs[0].to", "want 0 to 1"},
		{"member port without index", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: 2, Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a.p"}}}}}, "groups[0].refs[0].to", `"a.0.p"`},
	}
	for _, tt := range tests {
		err := tt.spec.Validate()
		var se *portalloc.SpecError
		if !errors.As(err, &se) || !errors.Is(err, portalloc.ErrInvalidRequest) || se.Field != tt.field || !strings.Contains(se.Reason, tt.want) {
			t.Errorf("%s: Validate() = %v; want a SpecError for %s saying %q", tt.name, err, tt.field, tt.want)
		}
	}

	// More ports than the range holds: found when allocating.
	base := freeRun(t, 4)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: portalloc.Range{First: base, Last: base + 3}})
	_, err := a.AllocateSet(context.Background(), portalloc.SetSpec{Name: "big", Groups: []portalloc.GroupSpec{{Name: "a", Members: 5, Ports: []portalloc.PortSpec{port("p")}}}})
	if !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), "needs 5 ports") {
		t.Errorf("AllocateSet of 5 members on 4 ports = %v; want ErrInvalidRequest saying it needs 5", err)
	}
}

func TestParseSetSpec(t *testing.T) {
	doc := `{"name":"dev","groups":[
		{"name":"api","members":3,"ports":[{"name":"http"},{"name":"grpc","scope":"group"}]},
		{"name":"web","ports":[{"name":"http","address":"::1","sticky":true}],
		 "refs":[{"env":"API_GRPC","to":"api.grpc"},{"env":"API_PRIMARY_HTTP","to":"api.0.http"}]}]}`
	spec, err := portalloc.ParseSetSpec([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := apiWebSpec()
	want.Groups[1].Ports[0].Address = lo6
	want.Groups[1].Ports[0].Sticky = true
	gotJSON, _ := json.Marshal(spec)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("ParseSetSpec =\n%s\nwant\n%s", gotJSON, wantJSON)
	}
	for _, bad := range []string{`{"name":"x","groups":[{"name":"a","ports":[{"name":"p","scop":"group"}]}]}`, `{"name":`, `[]`, `{"name":"x","groups":[{"name":"a","ports":[{"name":"p"}]}]} {}`} {
		if _, err := portalloc.ParseSetSpec([]byte(bad)); !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("ParseSetSpec(%s) = %v; want ErrInvalidRequest", bad, err)
		}
	}
}

func TestStickyPort(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Logger: log.logger()})
	r1, err := a.Allocate(ctx, portalloc.Request{Label: "pg", Sticky: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Release(ctx, r1)
	_ = a.Close()

	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Logger: log.logger()})
	r2, err := b.Allocate(ctx, portalloc.Request{Label: "pg", Sticky: true})
	if err != nil || r2.Port != r1.Port {
		t.Fatalf("sticky Allocate after a restart = %d, %v; want %d", r2.Port, err, r1.Port)
	}
	_ = b.Release(ctx, r2)

	// Taken by another process meanwhile: a fresh port, and the reason logged.
	holdInWorker(t, dir, lo4, r1.Port)
	r3, err := b.Allocate(ctx, portalloc.Request{Label: "pg", Sticky: true})
	if err != nil || r3.Port == r1.Port {
		t.Fatalf("sticky Allocate of a held port = %d, %v; want another port", r3.Port, err)
	}
	if log.count("sticky port was not free") != 1 {
		t.Errorf("the reason was not logged: %q", log.lines)
	}
	if _, err := b.Allocate(ctx, portalloc.Request{Sticky: true}); !errors.Is(err, portalloc.ErrInvalidRequest) {
		t.Errorf("sticky Allocate without a label = %v; want ErrInvalidRequest", err)
	}
}

// setWorker allocates the set in BERTH_TEST_SPEC on BERTH_TEST_RANGE, prints
// its manifest and holds it. As "orch" it also starts a sleeper child for
// each member, hands it the member's ports, and prints the child's pid.
func setWorker(ctx context.Context, mode string) error {
	r, err := portalloc.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
	if err != nil {
		return err
	}
	a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: os.Getenv("BERTH_STATE_DIR"), Range: r, AllowEphemeralOverlap: true})
	if err != nil {
		return err
	}
	defer a.Close()
	spec, err := portalloc.ParseSetSpec([]byte(os.Getenv("BERTH_TEST_SPEC")))
	if err != nil {
		return err
	}
	_, _ = os.Stdin.Read(make([]byte, 1)) // start together
	set, err := a.AllocateSet(ctx, spec)
	if err != nil {
		return err
	}
	if mode == "orch" {
		for _, m := range set.Members() {
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(append(os.Environ(), "BERTH_TEST_WORKER=sleeper"), m.Env()...)
			child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // outlives us
			if err := child.Start(); err != nil {
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
	manifest portalloc.Manifest
}

func startSetWorker(t *testing.T, mode, dir, rng string, spec portalloc.SetSpec) *setProc {
	t.Helper()
	js, _ := json.Marshal(spec)
	return &setProc{proc: spawn(t, mode, "BERTH_STATE_DIR="+dir, "BERTH_TEST_RANGE="+rng, "BERTH_TEST_SPEC="+string(js))}
}

func (p *setProc) read(t *testing.T) {
	t.Helper()
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			t.Fatalf("set worker pid %d ended: %v", p.cmd.Process.Pid, err)
		}
		if pid, ok := strings.CutPrefix(strings.TrimSpace(line), "child "); ok {
			n, _ := strconv.Atoi(pid)
			p.children = append(p.children, n)
			continue
		}
		if err := json.Unmarshal([]byte(line), &p.manifest); err != nil {
			t.Fatalf("set worker said %q", line)
		}
		return
	}
}

func manifestPorts(m portalloc.Manifest) []uint16 {
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
	base := 26500
	rng := fmt.Sprintf("%d-%d", base, base+99)
	spec := func(name string, n int) portalloc.SetSpec {
		return portalloc.SetSpec{Name: name, Groups: []portalloc.GroupSpec{{Name: "svc", Members: n, Ports: []portalloc.PortSpec{{Name: "http"}, {Name: "admin", Scope: portalloc.ScopeGroup}}}}}
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
	r, _ := portalloc.ParseRange(rng)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: r, AllowEphemeralOverlap: true})
	if _, err := a.AllocateSet(context.Background(), spec("three", 59)); !errors.Is(err, portalloc.ErrRangeExhausted) {
		t.Fatalf("a 60-port set beside 80 held ports = %v; want ErrRangeExhausted", err)
	}
	_ = p1.cmd.Process.Kill()
	_ = p1.cmd.Wait()
	set, err := a.AllocateSet(context.Background(), spec("three", 59))
	if err != nil {
		t.Fatalf("a 60-port set after the holder of 40 was killed = %v", err)
	}
	got := manifestPorts(set.Manifest())
	for _, p := range got {
		if slices.Contains(ports2, p) {
			t.Errorf("port %d of the live set was handed out again", p)
		}
	}
	if a.Stats().Reaped < 20 {
		t.Errorf("Stats().Reaped = %d; want the dead set's rows reaped", a.Stats().Reaped)
	}
}

// TestOrchestratorCrash: an orchestrator allocates a set, starts a child
// per member, hands each its ports and is SIGKILLed. The ports stay
// reserved while the child lives and are free once it has exited.
func TestOrchestratorCrash(t *testing.T) {
	dir := t.TempDir()
	orch := startSetWorker(t, "orch", dir, "26700-26799", portalloc.SetSpec{Name: "app", Groups: []portalloc.GroupSpec{{Name: "svc", Ports: []portalloc.PortSpec{{Name: "http"}}}}})
	_, _ = orch.stdin.Write([]byte{1})
	orch.read(t)
	if len(orch.children) != 1 {
		t.Fatalf("children = %v; want one", orch.children)
	}
	child := orch.children[0]
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	port := orch.manifest.Members[0].Ports["http"].Port

	_ = orch.cmd.Process.Kill()
	_ = orch.cmd.Wait()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	_, err := a.Reserve(context.Background(), portalloc.Request{}, port)
	var ce *portalloc.ConflictError
	if !errors.As(err, &ce) || ce.HolderPID != child {
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
	pid, fds := os.Getenv(portalloc.EnvListenPID), os.Getenv(portalloc.EnvListenFDs)
	in, err := portalloc.InheritedSockets()
	if err != nil {
		return err
	}
	l, ok := in.Listeners["http"]
	if !ok {
		return fmt.Errorf("no inherited listener named http (LISTEN_PID=%s)", pid)
	}
	return http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// InheritedSockets unset LISTEN_*, so this process's own children
		// would not take the sockets for theirs.
		fmt.Fprintf(w, "pid %d LISTEN_PID %s LISTEN_FDS %s now %q", os.Getpid(), pid, fds, os.Getenv(portalloc.EnvListenFDs))
	}))
}

// TestListenerHandoff: the parent allocates a port already listening and
// hands the socket to a child, which serves HTTP on it without binding.
func TestListenerHandoff(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	r, ln, err := a.Listen(ctx, portalloc.Request{Label: "web"})
	if err != nil {
		t.Fatal(err)
	}
	// The port is taken from the moment Listen returns.
	if l2, err := net.Listen("tcp", r.AddrPort().String()); err == nil {
		_ = l2.Close()
		t.Fatal("the allocated port was not bound")
	}
	var h portalloc.Handoff
	if err := h.Add("http", ln); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BERTH_TEST_WORKER=serve")
	cmd.Stderr = os.Stderr
	if err := h.Apply(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := a.Transfer(ctx, r, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	_ = ln.Close() // the parent's copies; the child's socket stays open

	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + r.AddrPort().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	want := fmt.Sprintf("pid %d LISTEN_PID %d LISTEN_FDS 1 now \"\"", cmd.Process.Pid, cmd.Process.Pid)
	if string(body) != want {
		t.Errorf("child said %q; want %q (the sh wrapper keeps the pid and sets LISTEN_PID)", body, want)
	}
}
