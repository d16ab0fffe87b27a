package who_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/who"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// listen is a plain Go program outside berth: it listens on TCP and UDP
// port os.Args[len-1] of 127.0.0.1, says "ready", and runs until its
// standard input closes or a signal ends it.
func listen() int {
	port := os.Args[len(os.Args)-1]
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	c, err := net.ListenPacket("udp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

func init() { testproc.Register("listen", listen) }

// startListener starts the worker listen on port and waits until it
// listens.
func startListener(tb testing.TB, port uint16) *exec.Cmd {
	tb.Helper()
	cmd := testproc.Command(tb, "listen", strconv.Itoa(int(port)))
	stdin, stdout := testproc.Start(tb, cmd)
	tb.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		tb.Fatalf("worker listen %d said %q, %v; want ready", port, line, err)
	}
	return cmd
}

// TestLookupFindsOutsideListener: a program outside berth listening on a
// port is found, with its pid, user, name and command line, on TCP and
// UDP; the port has no reservation.
func TestLookupFindsOutsideListener(t *testing.T) {
	testports.Hold(t, testports.Who)
	port := testports.Who.First
	cmd := startListener(t, port)
	reps, err := who.Lookup(context.Background(), nil, port)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 || reps[0].Port != port {
		t.Fatalf("Lookup(%d) = %+v; want one report of port %d", port, reps, port)
	}
	r := reps[0]
	if r.SocketsErr != nil || len(r.Reservations) != 0 {
		t.Errorf("Lookup(%d): SocketsErr %v, %d reservations; want nil, 0", port, r.SocketsErr, len(r.Reservations))
	}
	var protos []string
	for _, s := range r.Sockets {
		protos = append(protos, fmt.Sprintf("%s %s %s", s.Protocol, s.Local, s.State))
		if len(s.Processes) != 1 {
			t.Fatalf("socket %s %s held by %+v; want the worker alone", s.Protocol, s.Local, s.Processes)
		}
		p := s.Processes[0]
		if p.PID != cmd.Process.Pid || p.UID != os.Getuid() || p.User == "" || s.User != p.User {
			t.Errorf("holder = pid %d uid %d user %q (socket's %q); want pid %d uid %d", p.PID, p.UID, p.User, s.User, cmd.Process.Pid, os.Getuid())
		}
		if p.Name != filepath.Base(cmd.Path)[:min(15, len(filepath.Base(cmd.Path)))] || !slices.Equal(p.Args, cmd.Args) {
			t.Errorf("holder name %q, args %q; want %q, %q", p.Name, p.Args, filepath.Base(cmd.Path), cmd.Args)
		}
	}
	slices.Sort(protos)
	want := []string{fmt.Sprintf("tcp 127.0.0.1:%d LISTEN", port), fmt.Sprintf("udp 127.0.0.1:%d UNCONN", port)}
	if !slices.Equal(protos, want) {
		t.Errorf("Lookup(%d) sockets = %q; want %q", port, protos, want)
	}
}

// TestLookupReservation: a port reserved and listened on by this process
// shows both the reservation, alive, and this process as the holder; a
// free port shows neither.
func TestLookupReservation(t *testing.T) {
	testports.Hold(t, testports.Who)
	ctx := context.Background()
	cfg := portalloc.Config{StateDir: t.TempDir(), Mode: portalloc.ModeStateStore,
		Range: store.Range{First: testports.Who.First + 10, Last: testports.Who.First + 19}}
	al, err := portalloc.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	res, l, err := al.Listen(ctx, portalloc.Request{Label: "api.http"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := statestore.Open(ctx, filepath.Join(cfg.StateDir, "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	free := testports.Who.First + 30
	reps, err := who.Lookup(ctx, s, res.Port, free, res.Port)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 {
		t.Fatalf("Lookup(%d, %d, %d) = %d reports; want 2", res.Port, free, res.Port, len(reps))
	}
	got := reps[0]
	if reps[1].Port == res.Port {
		got, reps[1] = reps[1], reps[0]
	}
	if len(got.Reservations) != 1 || got.Reservations[0].Label != "api.http" || !got.Reservations[0].Alive || got.Reservations[0].Owner.PID != os.Getpid() {
		t.Errorf("reservations of %d = %+v; want api.http, alive, of pid %d", res.Port, got.Reservations, os.Getpid())
	}
	if len(got.Sockets) != 1 || len(got.Sockets[0].Processes) != 1 || got.Sockets[0].Processes[0].PID != os.Getpid() {
		t.Errorf("sockets of %d = %+v; want one, of this process", res.Port, got.Sockets)
	}
	if len(got.Locks) != 1 || got.Locks[0].Addr != res.Addr || len(got.Locks[0].Processes) != 1 || got.Locks[0].Processes[0].PID != os.Getpid() {
		t.Errorf("locks of %d = %+v; want one of %v, held by this process", res.Port, got.Locks, res.Addr)
	}
	if f := reps[1]; f.Port != free || len(f.Reservations)+len(f.Sockets)+len(f.Locks) != 0 {
		t.Errorf("report of free port %d = %+v; want nothing", free, f)
	}
}

// TestSignal: Signal stops an outside listener, and a Report that has
// gone stale (its process exited) signals nothing.
func TestSignal(t *testing.T) {
	testports.Hold(t, testports.Who)
	port := testports.Who.First + 1
	cmd := startListener(t, port)
	reps, err := who.Lookup(context.Background(), nil, port)
	if err != nil || len(reps) != 1 || len(reps[0].Sockets) == 0 || len(reps[0].Sockets[0].Processes) == 0 {
		t.Fatalf("Lookup(%d) = %+v, %v; want the worker", port, reps, err)
	}
	p := reps[0].Sockets[0].Processes[0]
	if err := who.Signal(p, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Errorf("worker ended with %v; want SIGTERM", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("worker still runs 10s after SIGTERM")
	}
	if err := who.Signal(p, syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal(exited worker) = %v; want os.ErrProcessDone", err)
	}
	for _, pid := range []int{0, 1} {
		if err := who.Signal(who.Process{PID: pid}, syscall.SIGTERM); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Signal(pid %d) = %v; want ErrInvalid", pid, err)
		}
	}
}

// TestSignalOtherUser: a caller that is not root may not signal another
// user's process; Signal says so and sends nothing. It runs as root by
// dropping to nobody in a worker.
func TestSignalOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a worker as another user")
	}
	testports.Hold(t, testports.Who)
	port := testports.Who.First + 2
	cmd := startListener(t, port)
	reps, err := who.Lookup(context.Background(), nil, port)
	if err != nil || len(reps[0].Sockets) == 0 || len(reps[0].Sockets[0].Processes) == 0 {
		t.Fatalf("Lookup(%d) = %+v, %v", port, reps, err)
	}
	p := reps[0].Sockets[0].Processes[0]
	// A worker running as nobody tries to signal the listener, root's.
	w := testproc.Command(t, "signal", strconv.Itoa(p.PID))
	w.Path = copyForAll(t, w.Path) // nobody cannot reach go test's build directory
	w.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := w.CombinedOutput()
	if err != nil {
		t.Fatalf("worker signal: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "belongs to another user") {
		t.Errorf("Signal from nobody to root's pid %d = %q; want refused: belongs to another user", p.PID, out)
	}
	if cmd.ProcessState != nil {
		t.Errorf("the listener exited: %v", cmd.ProcessState)
	}
}

func init() {
	testproc.Register("signal", func() int {
		pid, _ := strconv.Atoi(os.Args[len(os.Args)-1])
		fmt.Println(who.Signal(who.Process{PID: pid}, syscall.SIGTERM))
		return 0
	})
}

// copyForAll copies the executable at path to a directory every user may
// read and returns the copy's path.
func copyForAll(tb testing.TB, path string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "who-test-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	dst := filepath.Join(dir, "who.test")
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dst
}

func netipMust(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestOverlaps(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.1", "127.0.0.2", false},
		{"0.0.0.0", "127.0.0.1", true},
		{"127.0.0.1", "0.0.0.0", true},
		{"::", "127.0.0.1", true},
		{"127.0.0.1", "::", true},
		{"0.0.0.0", "::1", false},
		{"::1", "0.0.0.0", false},
		{"::ffff:127.0.0.1", "127.0.0.1", true},
	} {
		a, b := netipMust(c.a), netipMust(c.b)
		if got := who.Overlaps(a, b); got != c.want {
			t.Errorf("Overlaps(%s, %s) = %v; want %v", c.a, c.b, got, c.want)
		}
	}
}
