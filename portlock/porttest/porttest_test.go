package porttest_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/portlock/porttest"
)

// testRange is this package's own range in berth's test suite
// (internal/testports.Porttest of the main module): go test ./... runs the
// other packages' tests at once, each in a range of its own, and a port of
// theirs locked here would be refused to them.
const testRange = "22000-22999"

func TestMain(m *testing.M) {
	_ = os.Setenv(porttest.EnvPortRange, testRange)
	os.Exit(m.Run())
}

// locked reports whether another holder than this test's cleanup
// would find tcp addr:p locked.
func locked(tb testing.TB, network, addr string, p int) bool {
	tb.Helper()
	l, err := portlock.Acquire(network, netip.MustParseAddr(addr), uint16(p))
	if err == nil {
		_ = l.Close()
		return false
	}
	if !errors.Is(err, portlock.ErrHeld) {
		tb.Fatal(err)
	}
	return true
}

func TestPort(t *testing.T) {
	var p int
	t.Run("inner", func(t *testing.T) {
		p = porttest.Port(t)
		if p < 22000 || p > 22999 {
			t.Errorf("Port = %d; want one of %s, from %s", p, testRange, porttest.EnvPortRange)
		}
		if !locked(t, "tcp", "0.0.0.0", p) {
			t.Error("the port is not locked while the test runs")
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("the test cannot bind its own port: %v", err)
		}
		_ = ln.Close()
	})
	if locked(t, "tcp", "127.0.0.1", p) {
		t.Error("the port is still locked after its test ended")
	}
}

// TestDefaultRange: with no range set, ports come from 20000-32767. The
// one port it takes may lie in another package's range, for as long as
// this test runs.
func TestDefaultRange(t *testing.T) {
	t.Setenv(porttest.EnvPortRange, "")
	if p := porttest.Port(t); p < 20000 || p > 32767 {
		t.Errorf("Port = %d with %s unset; want 20000-32767", p, porttest.EnvPortRange)
	}
}

func TestPorts(t *testing.T) {
	ps := porttest.Ports(t, 50)
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p] {
			t.Fatalf("Ports returned %d twice", p)
		}
		seen[p] = true
	}
	if got := porttest.Ports(t, 0); len(got) != 0 {
		t.Errorf("Ports(0) = %v", got)
	}
}

func TestAddrOn(t *testing.T) {
	a := porttest.Addr(t)
	ap, err := netip.ParseAddrPort(a)
	if err != nil || ap.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("Addr = %q; want 127.0.0.1:PORT", a)
	}
	w := porttest.Addr(t, porttest.On("0.0.0.0"))
	wp, _ := netip.ParseAddrPort(w)
	if !locked(t, "tcp", "127.0.0.9", int(wp.Port())) {
		t.Error("a wildcard's port is not locked on every address")
	}
	if ln, err := net.Listen("tcp6", "[::1]:0"); err == nil {
		_ = ln.Close()
		v6 := porttest.Addr(t, porttest.On("::1"))
		if !strings.HasPrefix(v6, "[::1]:") {
			t.Errorf("Addr(On(::1)) = %q", v6)
		}
	}
}

func TestUDP(t *testing.T) {
	p := porttest.UDPPort(t)
	if !locked(t, "udp", "127.0.0.1", p) || locked(t, "tcp", "127.0.0.1", p) {
		t.Errorf("UDPPort %d: locked for udp, not for tcp, is what is wanted", p)
	}
	pc := porttest.PacketConn(t)
	up := pc.LocalAddr().(*net.UDPAddr).Port
	if !locked(t, "udp", "0.0.0.0", up) {
		t.Error("PacketConn's port is not locked")
	}
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	_ = pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := pc.ReadFrom(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("ReadFrom = %q, %v", buf, err)
	}
}

func TestListenerWithHTTPTest(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Listener.Close()
	srv.Listener = porttest.Listener(t)
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "ok" {
		t.Fatalf("body %q", body)
	}
	p := srv.Listener.Addr().(*net.TCPAddr).Port
	if !locked(t, "tcp", "127.0.0.1", p) {
		t.Error("the listener's port is not locked")
	}
}

// fakeTB records a test's failure instead of failing the test that runs it.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	failed   string
	cleanups []func()
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Name() string      { return "Fake" }
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.failed = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	panic(f)
}

// run runs fn, the body of a test, with a fakeTB and returns what it
// failed with.
func run(t *testing.T, fn func(tb testing.TB)) string { //nolint:thelper // it runs a test body; failures point at the body's lines
	f := &fakeTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != any(f) {
				panic(r)
			}
		}()
		fn(f)
	}()
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f.failed
}

func TestRangeFromEnv(t *testing.T) {
	base := 40000 + os.Getpid()%5000
	t.Setenv(porttest.EnvPortRange, fmt.Sprintf("%d-%d", base, base+1))
	var got []int
	msg := run(t, func(tb testing.TB) { //nolint:thelper // a test body, not a helper
		got = porttest.Ports(tb, 2)
	})
	if msg != "" {
		// Another test binary may hold these; that is no failure of this one.
		t.Skipf("two ports of %d-%d: %s", base, base+1, msg)
	}
	for _, p := range got {
		if p != base && p != base+1 {
			t.Errorf("port %d outside %s", p, os.Getenv(porttest.EnvPortRange))
		}
	}
	// A third of a range of two cannot be had; the test says why.
	msg = run(t, func(tb testing.TB) { //nolint:thelper // a test body, not a helper

		porttest.Ports(tb, 2)
		porttest.Port(tb)
	})
	if !strings.Contains(msg, "no free tcp port") || !strings.Contains(msg, porttest.EnvPortRange) {
		t.Errorf("exhausted range: %q; want it to say no free port, and name %s", msg, porttest.EnvPortRange)
	}
}

func TestBadInput(t *testing.T) {
	t.Setenv(porttest.EnvPortRange, "70000-1")
	if msg := run(t, func(tb testing.TB) { //nolint:thelper // a test body, not a helper
		porttest.Port(tb)
	}); !strings.Contains(msg, porttest.EnvPortRange) || !strings.Contains(msg, "70000-1") {
		t.Errorf("bad range: %q; want the variable and its value named", msg)
	}
	t.Setenv(porttest.EnvPortRange, "")
	if msg := run(t, func(tb testing.TB) { //nolint:thelper // a test body, not a helper
		porttest.Port(tb, porttest.On("localhost"))
	}); !strings.Contains(msg, `On("localhost")`) {
		t.Errorf("bad address: %q; want On(\"localhost\") named", msg)
	}
	if msg := run(t, func(tb testing.TB) { //nolint:thelper // a test body, not a helper
		porttest.Ports(tb, -1)
	}); !strings.Contains(msg, "Ports(-1)") {
		t.Errorf("negative count: %q", msg)
	}
}

func TestNoHome(t *testing.T) {
	t.Setenv("HOME", "")
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("TMPDIR", "/nonexistent")
	if p := porttest.Port(t); p == 0 {
		t.Fatal("no port without a home")
	}
}

// TestWorkerPorts is run by TestAcrossProcesses in other processes: it
// takes ports, prints them, and holds them until its stdin closes.
func TestWorkerPorts(t *testing.T) {
	if os.Getenv("PORTTEST_WORKER") == "" {
		t.Skip("run by TestAcrossProcesses")
	}
	for _, p := range porttest.Ports(t, 200) {
		fmt.Println(p)
	}
	fmt.Println("done")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// TestAcrossProcesses runs test binaries at once, each taking ports of one
// small range and holding them: no port goes to two of them.
func TestAcrossProcesses(t *testing.T) {
	const workers = 4
	base := 41000 + (os.Getpid()%20)*1000
	var (
		mu   sync.Mutex
		seen = map[int]int{}
		wg   sync.WaitGroup
	)
	var stdins []io.Closer
	for w := range workers {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerPorts$", "-test.count=1")
		cmd.Env = append(os.Environ(), "PORTTEST_WORKER=1", fmt.Sprintf("%s=%d-%d", porttest.EnvPortRange, base, base+999))
		out, _ := cmd.StdoutPipe()
		in, _ := cmd.StdinPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stdins = append(stdins, in)
		t.Cleanup(func() { _ = cmd.Wait() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == "done" {
					return
				}
				if p, err := strconv.Atoi(sc.Text()); err == nil {
					mu.Lock()
					if other, dup := seen[p]; dup {
						t.Errorf("port %d went to workers %d and %d", p, other, w)
					}
					seen[p] = w
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait() // every worker holds its ports now
	for _, in := range stdins {
		_ = in.Close()
	}
	if len(seen) != workers*200 {
		t.Errorf("%d distinct ports; want %d", len(seen), workers*200)
	}
}
