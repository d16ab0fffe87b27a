// Package porttest hands ports to tests. Every port comes from the shared
// per-user berth store (configured by the BERTH_* variables, see
// portalloc.ConfigFromEnv), so the test binaries that go test ./... runs in
// parallel never get the same port, and it is released by t.Cleanup. A test
// that cannot get a port fails with a message that says why.
//
//	func TestServer(t *testing.T) {
//		addr := porttest.Addr(t) // "127.0.0.1:PORT"
//		...
//	}
//
// The Allocator behind the helpers is opened on first use and kept open
// while tests use it: a port costs one allocation, not the opening of a
// store. It is closed 20 ms after the last test using it has finished,
// unless another test starts using it first, so sequential tests share it.
// Goroutine-leak checks such as goleak.VerifyTestMain retry for several
// hundred milliseconds before they report, so they find nothing of it.
//
// Where there is no default state directory (no HOME, or one that cannot
// be written, as in Nix and Bazel sandboxes and minimal CI containers) and
// BERTH_STATE_DIR is not set, porttest keeps its store in a directory of the
// user's under the temporary directory, os.TempDir()/berth-<uid>, created
// with mode 0700, and says so through t.Log; it refuses such a directory
// that another user owns, that others may write or that is a symbolic
// link. The test binaries of a run share it as long as they share TMPDIR.
// (portalloc.New itself still refuses without a default: reservations that
// outlive a test run belong in a directory no temp cleaner empties.)
//
// When berth falls back to its MRU file (the state store cannot be used; see
// package portalloc), a port is only remembered, not reserved, and another
// test binary may be given it too. Each test that gets such a port says so
// through t.Log, with the cause; set BERTH_MODE=statestore to make the
// fallback fail the test instead.
package porttest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
)

var (
	mu       sync.Mutex // guards alloc, users and idle
	alloc    *portalloc.Allocator
	allocEnv string // the BERTH_* variables alloc was configured from
	users    int
	idle     *time.Timer // closes alloc once no test has used it for idleClose

	warned sync.Map // testing.TB -> true: tests told of a fallback
)

// berthEnv returns the BERTH_* variables, sorted, as one string.
func berthEnv() string {
	var vs []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "BERTH_") {
			vs = append(vs, kv)
		}
	}
	slices.Sort(vs)
	return strings.Join(vs, "\x00")
}

// idleClose is how long the shared Allocator stays open after the last
// test using it has finished.
const idleClose = 20 * time.Millisecond

// noteBackend tells tb, once per test, that r comes from the MRU file.
func noteBackend(tb testing.TB, a *portalloc.Allocator, r portalloc.Reservation) {
	tb.Helper()
	if r.Backend != portalloc.BackendMRU {
		return
	}
	if _, dup := warned.LoadOrStore(tb, true); dup {
		return
	}
	tb.Cleanup(func() { warned.Delete(tb) })
	why := "BERTH_MODE=mru"
	if cause := a.FallbackCause(); cause != nil {
		why = "the state store is unavailable: " + cause.Error()
	}
	blind := "it still skips the ports the store holds"
	if a.Stats().Blind > 0 {
		blind = "the store cannot even be read, so ports it holds are not skipped"
	}
	tb.Logf("porttest: %s comes from berth's MRU file (%s); it is remembered, not reserved, so another test binary may be given it too (%s). Run berth doctor; BERTH_MODE=statestore makes this fail instead.", r, why, blind)
}

// allocator returns the shared Allocator and keeps it open until tb ends.
func allocator(tb testing.TB) *portalloc.Allocator {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if idle != nil {
		idle.Stop() // a test uses it again: keep it open
		idle = nil
	}
	// The configuration comes from the BERTH_* variables, which a test may
	// set (t.Setenv): an Allocator of another configuration is replaced.
	env := berthEnv()
	if alloc != nil && env != allocEnv && users == 0 {
		_ = alloc.Close()
		alloc = nil
	}
	if alloc == nil {
		allocEnv = env
		cfg, err := portalloc.ConfigFromEnv()
		if err != nil {
			tb.Fatalf("porttest: %v", err)
		}
		if cfg.StoreDSN != "" {
			// A fleet's store is for a fleet's programs, which open it
			// through portalloc/fleet; a test's ports are this host's.
			tb.Logf("porttest: %s is set; porttest keeps its ports in this host's store all the same", portalloc.EnvStore)
			cfg.StoreDSN = ""
		}
		if cfg.StateDir == "" {
			dir, why, err := stateDir()
			if err != nil {
				tb.Fatalf("porttest: no state directory: %v; set %s", err, portalloc.EnvStateDir)
			}
			if dir != "" {
				cfg.StateDir = dir
				tb.Logf("porttest: using %s as the state directory: %s", dir, why)
			}
		}
		a, err := portalloc.New(context.Background(), cfg)
		if err != nil {
			tb.Fatalf("porttest: cannot open the berth store: %v", err)
		}
		alloc = a
	}
	users++
	tb.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if users--; users > 0 {
			return
		}
		a := alloc
		var t *time.Timer
		t = time.AfterFunc(idleClose, func() {
			mu.Lock()
			if idle != t || users > 0 { // used again meanwhile
				mu.Unlock()
				return
			}
			alloc, idle = nil, nil
			mu.Unlock()
			_ = a.Close() // what it could not release is reaped after the binary exits
		})
		idle = t
	})
	return alloc
}

// Option changes the address a helper reserves its ports on.
type Option func(*options)

type options struct {
	addr    string // as given to On
	setAddr bool
}

// On makes a helper reserve (and, for Listener and PacketConn, bind) on
// addr instead of 127.0.0.1: "::1" for IPv6 loopback, "0.0.0.0" or "::"
// for a server that a container or another host must reach. A wildcard
// reservation conflicts with every address of its port, by the rule of
// package portalloc. An address that does not parse fails the test.
func On(addr string) Option {
	return func(o *options) { o.addr, o.setAddr = addr, true }
}

// request builds the portalloc request of a helper call.
func request(tb testing.TB, protocol portalloc.Protocol, opts []Option) portalloc.Request {
	tb.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	req := portalloc.Request{Protocol: protocol, Label: "test:" + tb.Name()}
	if o.setAddr {
		a, err := netip.ParseAddr(o.addr)
		if err != nil {
			tb.Fatalf("porttest: On(%q): not an IP address; want one such as 127.0.0.1, ::1, 0.0.0.0 or ::", o.addr)
		}
		req.Addr = a
	}
	return req
}

func get(tb testing.TB, protocol portalloc.Protocol, n int, opts []Option) []portalloc.Reservation {
	tb.Helper()
	req := request(tb, protocol, opts)
	a := allocator(tb)
	rs := make([]portalloc.Reservation, 0, n)
	for range n {
		r, err := a.Allocate(context.Background(), req)
		if err != nil {
			tb.Fatalf("porttest: no free %s port for %s: %v", protocol, tb.Name(), err)
		}
		noteBackend(tb, a, r)
		tb.Cleanup(func() { _ = a.Release(context.Background(), r) })
		rs = append(rs, r)
	}
	return rs
}

// Port returns a free TCP port on 127.0.0.1 (or the address of On),
// reserved until tb ends.
func Port(tb testing.TB, opts ...Option) int {
	tb.Helper()
	return int(get(tb, portalloc.TCP, 1, opts)[0].Port)
}

// Ports returns n distinct free TCP ports on 127.0.0.1 (or the address of
// On), reserved until tb ends. Like Consul's freeport.GetN, but no other
// test binary of the user gets them either.
func Ports(tb testing.TB, n int, opts ...Option) []int {
	tb.Helper()
	if n < 0 {
		tb.Fatalf("porttest: Ports(%d): want a count of 0 or more", n)
	}
	rs := get(tb, portalloc.TCP, n, opts)
	ports := make([]int, len(rs))
	for i, r := range rs {
		ports[i] = int(r.Port)
	}
	return ports
}

// UDPPort returns a free UDP port on 127.0.0.1 (or the address of On),
// reserved until tb ends.
func UDPPort(tb testing.TB, opts ...Option) int {
	tb.Helper()
	return int(get(tb, portalloc.UDP, 1, opts)[0].Port)
}

// Addr returns "HOST:PORT" for a free TCP port on 127.0.0.1 (or the
// address of On), reserved until tb ends.
func Addr(tb testing.TB, opts ...Option) string {
	tb.Helper()
	return get(tb, portalloc.TCP, 1, opts)[0].AddrPort().String()
}

// Listener returns a listener on a free TCP port of 127.0.0.1 (or the
// address of On), bound in the same transaction that reserved it; it is
// closed and released when tb ends. It fits httptest:
//
//	srv := httptest.NewUnstartedServer(handler)
//	srv.Listener.Close()
//	srv.Listener = porttest.Listener(t)
//	srv.Start()
//	defer srv.Close()
func Listener(tb testing.TB, opts ...Option) net.Listener {
	tb.Helper()
	req := request(tb, portalloc.TCP, opts)
	a := allocator(tb)
	r, ln, err := a.Listen(context.Background(), req)
	if err != nil {
		tb.Fatalf("porttest: no free TCP port for %s: %v", tb.Name(), err)
	}
	noteBackend(tb, a, r)
	tb.Cleanup(func() {
		_ = ln.Close()
		_ = a.Release(context.Background(), r)
	})
	return ln
}

// PacketConn returns a UDP socket bound to a free port of 127.0.0.1 (or the
// address of On) in the same transaction that reserved it; it is closed
// and released when tb ends.
func PacketConn(tb testing.TB, opts ...Option) net.PacketConn {
	tb.Helper()
	req := request(tb, portalloc.UDP, opts)
	a := allocator(tb)
	r, pc, err := a.ListenPacket(context.Background(), req)
	if err != nil {
		tb.Fatalf("porttest: no free UDP port for %s: %v", tb.Name(), err)
	}
	noteBackend(tb, a, r)
	tb.Cleanup(func() {
		_ = pc.Close()
		_ = a.Release(context.Background(), r)
	})
	return pc
}

// Set allocates every port of spec for tb (see portalloc.AllocateSet) and
// releases them when tb ends. The set's name is made unique per test.
func Set(tb testing.TB, spec portset.SetSpec) *portset.Set {
	tb.Helper()
	a := allocator(tb)
	spec.Name = fmt.Sprintf("%s-%p", spec.Name, tb)
	s, err := portset.Allocate(context.Background(), a, spec)
	if err != nil {
		tb.Fatalf("porttest: cannot allocate set for %s: %v", tb.Name(), err)
	}
	for _, m := range s.Members() {
		for _, r := range m.Ports {
			noteBackend(tb, a, r)
		}
	}
	tb.Cleanup(func() { _ = s.Release(context.Background()) })
	return s
}
