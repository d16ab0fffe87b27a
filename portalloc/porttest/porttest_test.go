package porttest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/portalloc/porttest"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/statestore"
)

// stateDir is the store every test of this binary shares, as the per-user
// store would be shared by the binaries of go test ./....
var stateDir string

func TestMain(m *testing.M) {
	// A worker is this test binary running TestPortsWorker alone, on its
	// parent's store, from the environment.
	testproc.Register("ports", m.Run)
	testproc.Register("sandbox", m.Run)
	testproc.MaybeRun()
	unlock, err := testports.Lock(testports.Porttest) // workers run under this hold
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "porttest-")
	if err != nil {
		panic(err)
	}
	stateDir = dir
	os.Setenv(portalloc.EnvStateDir, dir)
	os.Setenv(portalloc.EnvMode, string(portalloc.ModeStateStore))
	// This binary's store is its own: keep to the package's range, apart
	// from the other test binaries of go test ./....
	os.Setenv(portalloc.EnvPortRange, testports.Porttest.String())
	code := m.Run()
	unlock()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func rows(tb testing.TB) []statestore.Reservation {
	tb.Helper()
	s, err := statestore.Open(context.Background(), filepath.Join(stateDir, statedir.DatabaseFile), statestore.Options{SweepInterval: -1})
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close()
	rs, err := s.List(context.Background(), statestore.Filter{})
	if err != nil {
		tb.Fatal(err)
	}
	return rs
}

func TestPortsAreFreeDistinctAndReleased(t *testing.T) {
	var got []int
	t.Run("inner", func(t *testing.T) {
		got = append(got, porttest.Port(t))
		got = append(got, porttest.Ports(t, 3)...)
		got = append(got, porttest.UDPPort(t))
		seen := map[int]bool{}
		for _, p := range got[:4] {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			if !testports.Porttest.Contains(uint16(p)) {
				t.Errorf("port %d; want one in %v, from BERTH_PORT_RANGE", p, testports.Porttest)
			}
			seen[p] = true
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("port %d is not bindable: %v", p, err)
			}
			_ = l.Close()
		}
		if n := len(rows(t)); n != 5 {
			t.Errorf("%d rows while the test runs; want 5", n)
		}
		for _, r := range rows(t) {
			if r.Label != "test:TestPortsAreFreeDistinctAndReleased/inner" {
				t.Errorf("label %q; want the test's name", r.Label)
			}
		}
	})
	if rs := rows(t); len(rs) != 0 {
		t.Errorf("rows after the test ended: %v", rs)
	}
}

func TestListenerAndSet(t *testing.T) {
	ln := porttest.Listener(t)
	if _, err := net.Listen("tcp", ln.Addr().String()); err == nil {
		t.Error("the listener's port could be bound again")
	}
	s := porttest.Set(t, portset.SetSpec{Name: "web", Groups: []portset.GroupSpec{{Name: "app", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}}}})
	if a, b := s.Members()[0].Ports["http"].Port, s.Members()[1].Ports["http"].Port; a == b {
		t.Errorf("both members got port %d", a)
	}
}

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.msg = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Helper() {}

// TestNoPortFailsClearly: with the range full, a test fails with a message
// that names it and says why.
func TestNoPortFailsClearly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	t.Setenv(portalloc.EnvPortRange, strconv.Itoa(port)) // one port, bound outside berth
	t.Setenv(portalloc.EnvAllowEphemeralOverlap, "true")
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		porttest.Port(rec)
	}()
	<-done
	if !strings.Contains(rec.msg, "porttest: no free tcp port for TestNoPortFailsClearly") || !strings.Contains(rec.msg, "no free port in the range") {
		t.Errorf("failure message = %q", rec.msg)
	}
}

// TestPortsWorker is one test binary of many in TestParallelBinaries: it
// takes 20 ports through porttest, prints them and holds them until stdin
// closes.
func TestPortsWorker(t *testing.T) {
	if testproc.Role() != "ports" {
		t.Skip("runs only as a worker process of TestParallelBinaries")
	}
	for _, p := range porttest.Ports(t, 20) {
		fmt.Println(p)
	}
	fmt.Println("done")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// TestParallelBinaries: several test binaries take ports from the shared
// store at once and never get the same one.
func TestParallelBinaries(t *testing.T) {
	const binaries = 4
	seen := map[string]int{}
	var outs []*bufio.Scanner
	for range binaries { // all started before any is read
		cmd := testproc.Command(t, "ports", "-test.run=^TestPortsWorker$")
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
		outs = append(outs, bufio.NewScanner(stdout))
	}
	for i, sc := range outs {
		for sc.Scan() && sc.Text() != "done" {
			if prev, dup := seen[sc.Text()]; dup {
				t.Errorf("port %s went to binaries %d and %d", sc.Text(), prev, i)
			}
			seen[sc.Text()] = i
		}
	}
	if len(seen) != binaries*20 {
		t.Errorf("%d distinct ports; want %d", len(seen), binaries*20)
	}
}

// TestOnAndPacketConn: On moves a helper's reservation to another address,
// and PacketConn returns a UDP socket already bound to its reserved port.
func TestOnAndPacketConn(t *testing.T) {
	wild := porttest.Port(t, porttest.On("0.0.0.0"))
	var found bool
	for _, r := range rows(t) {
		if int(r.Port) == wild && r.Addr.String() == "0.0.0.0" {
			found = true
		}
	}
	if !found {
		t.Errorf("no reservation of 0.0.0.0:%d in %v", wild, rows(t))
	}
	// The wildcard holds the port on every address: no other test gets it.
	a, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: stateDir, Range: portalloc.Range(testports.Porttest)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Reserve(context.Background(), portalloc.Request{}, uint16(wild)); !errors.Is(err, portalloc.ErrPortHeld) {
		t.Errorf("Reserve of 127.0.0.1:%d beside porttest's 0.0.0.0 reservation = %v; want ErrPortHeld", wild, err)
	}

	pc := porttest.PacketConn(t)
	addr := pc.LocalAddr().(*net.UDPAddr)
	if !addr.IP.IsLoopback() || !testports.Porttest.Contains(uint16(addr.Port)) {
		t.Errorf("PacketConn bound to %v; want 127.0.0.1 and a port in %v", addr, testports.Porttest)
	}
	if _, err := net.ListenPacket("udp", addr.String()); err == nil {
		t.Errorf("the PacketConn's port %v could be bound again", addr)
	}
	if got := porttest.Addr(t, porttest.On("::1")); !strings.HasPrefix(got, "[::1]:") {
		t.Errorf(`Addr(On("::1")) = %q; want "[::1]:PORT"`, got)
	}
}

// TestOnBadAddressFails: an address that does not parse fails the test with
// a message that names it and says what is accepted.
func TestOnBadAddressFails(t *testing.T) {
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		porttest.Port(rec, porttest.On("localhost"))
	}()
	<-done
	if !strings.Contains(rec.msg, `On("localhost")`) || !strings.Contains(rec.msg, "0.0.0.0") {
		t.Errorf("failure message = %q", rec.msg)
	}
}
