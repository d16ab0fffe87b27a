// Package porttest hands ports to tests: free, and locked for the test until
// it ends, so that the test binaries go test ./... runs in parallel never get
// the same port, nor one that a berth program of the host holds.
//
//	func TestServer(t *testing.T) {
//		addr := porttest.Addr(t) // "127.0.0.1:PORT"
//		...
//	}
//
// Each port is a kernel lock (package portlock) and a bind probe: no store,
// no file, no state directory, so it works with HOME unset and in build
// sandboxes. Every berth process honours the lock, whatever store it keeps,
// and porttest honours theirs: neither is handed a port the other holds
// (berth ls shows a test's ports, with its pid, although they have no row
// of a store). The lock is the test process's: it is released by t.Cleanup,
// and by the kernel when the process dies, however it dies.
//
// Ports come from BERTH_PORT_RANGE when it is set ("20000-32767", as for
// berth), else 20000-32767, which lies under the ephemeral range of Linux
// (32768-60999), macOS and Windows (49152-65535): the system never gives one
// of these to an outgoing connection meanwhile.
//
// A test that cannot get a port fails with a message that says why.
package porttest

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-go/berth/portlock"
)

// EnvPortRange is the variable that sets the range ports come from.
const EnvPortRange = "BERTH_PORT_RANGE"

// Option changes the address a helper takes its ports on.
type Option func(*options)

type options struct{ addr *string }

// On makes a helper take (and, for Listener and PacketConn, bind) its port
// on addr instead of 127.0.0.1: "::1" for IPv6 loopback, "0.0.0.0" or "::"
// for a server that a container or another host must reach. A wildcard
// takes the port on every address. An address that does not parse fails
// the test.
func On(addr string) Option { return func(o *options) { o.addr = &addr } }

func address(tb testing.TB, opts []Option) netip.Addr {
	tb.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.addr == nil {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	a, err := netip.ParseAddr(*o.addr)
	if err != nil || a.Zone() != "" {
		tb.Fatalf("porttest: On(%q): not an IP address without a zone; want one such as 127.0.0.1, ::1, 0.0.0.0 or ::", *o.addr)
	}
	return a.Unmap()
}

// portRange returns the range ports come from.
func portRange() (first, last uint16, err error) {
	v := os.Getenv(EnvPortRange)
	if v == "" {
		return 20000, 32767, nil
	}
	a, b, ok := strings.Cut(strings.TrimSpace(v), "-")
	if !ok {
		b = a
	}
	lo, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	hi, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if err1 != nil || err2 != nil || lo == 0 || lo > hi {
		return 0, 0, fmt.Errorf("%s=%q: want FIRST-LAST, ports from 1 to 65535 with FIRST <= LAST, e.g. 20000-32767", EnvPortRange, v)
	}
	return uint16(lo), uint16(hi), nil
}

// take finds a port of the range that passes try, which holds what it
// took on success and returns an error wrapping portlock.ErrHeld for a
// port to pass over.
func take(tb testing.TB, what string, try func(port uint16) error) uint16 {
	tb.Helper()
	first, last, err := portRange()
	if err != nil {
		tb.Fatalf("porttest: %v", err)
	}
	// Every port of the range once, from a random one by a stride prime to
	// the range's size: tests racing for ports start in different places.
	n := uint32(last) - uint32(first) + 1
	start, stride := rand.Uint32N(n), uint32(1)
	if n > 2 {
		for stride = 1 + rand.Uint32N(n-1); gcd(stride, n) != 1; stride = 1 + rand.Uint32N(n-1) {
		}
	}
	for i := uint32(0); i < n; i++ {
		p := uint16(uint32(first) + (start+i*stride)%n)
		err := try(p)
		if err == nil {
			return p
		}
		if !errors.Is(err, portlock.ErrHeld) {
			tb.Fatalf("porttest: %s for %s: %v", what, tb.Name(), err)
		}
	}
	tb.Fatalf("porttest: no free %s for %s in %d-%d: every port is locked or bound (set %s for another range)", what, tb.Name(), first, last, EnvPortRange)
	return 0
}

func gcd(a, b uint32) uint32 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// lock takes a free port of network on addr, locked until tb ends.
func lock(tb testing.TB, network string, addr netip.Addr) uint16 {
	tb.Helper()
	return take(tb, network+" port on "+addr.String(), func(p uint16) error {
		l, err := portlock.Take(network, addr, p)
		if err != nil {
			return err
		}
		tb.Cleanup(func() { _ = l.Close() })
		return nil
	})
}

// Port returns a free TCP port on 127.0.0.1 (or the address of On), locked
// until tb ends.
func Port(tb testing.TB, opts ...Option) int {
	tb.Helper()
	return int(lock(tb, "tcp", address(tb, opts)))
}

// Ports returns n distinct free TCP ports on 127.0.0.1 (or the address of
// On), locked until tb ends: Consul's freeport.GetN, but no other test
// binary of the host, nor a berth program, gets them meanwhile.
func Ports(tb testing.TB, n int, opts ...Option) []int {
	tb.Helper()
	if n < 0 {
		tb.Fatalf("porttest: Ports(%d): want a count of 0 or more", n)
	}
	addr := address(tb, opts)
	ports := make([]int, n)
	for i := range ports {
		ports[i] = int(lock(tb, "tcp", addr))
	}
	return ports
}

// UDPPort returns a free UDP port on 127.0.0.1 (or the address of On),
// locked until tb ends.
func UDPPort(tb testing.TB, opts ...Option) int {
	tb.Helper()
	return int(lock(tb, "udp", address(tb, opts)))
}

// Addr returns "HOST:PORT" for a free TCP port on 127.0.0.1 (or the address
// of On), locked until tb ends.
func Addr(tb testing.TB, opts ...Option) string {
	tb.Helper()
	addr := address(tb, opts)
	return netip.AddrPortFrom(addr, lock(tb, "tcp", addr)).String()
}

// Listener returns a listener on a free TCP port of 127.0.0.1 (or the
// address of On), bound while the port is locked: nothing can take the port
// in between. It is closed and the port released when tb ends. It fits
// httptest:
//
//	srv := httptest.NewUnstartedServer(handler)
//	srv.Listener.Close()
//	srv.Listener = porttest.Listener(t)
//	srv.Start()
//	defer srv.Close()
func Listener(tb testing.TB, opts ...Option) net.Listener {
	tb.Helper()
	return bound(tb, "tcp", address(tb, opts), net.Listen)
}

// PacketConn returns a UDP socket bound to a free port of 127.0.0.1 (or the
// address of On) while the port is locked; it is closed and the port
// released when tb ends.
func PacketConn(tb testing.TB, opts ...Option) net.PacketConn {
	tb.Helper()
	return bound(tb, "udp", address(tb, opts), net.ListenPacket)
}

// bound binds a free port of network on addr with listen while the port is
// locked; both are released when tb ends.
func bound[T io.Closer](tb testing.TB, network string, addr netip.Addr, listen func(network, addr string) (T, error)) T {
	tb.Helper()
	var c T
	take(tb, network+" port on "+addr.String(), func(p uint16) error {
		l, err := portlock.Acquire(network, addr, p)
		if err != nil {
			return err
		}
		c, err = listen(network, netip.AddrPortFrom(addr, p).String())
		if err != nil {
			_ = l.Close()
			if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
				// Bound outside berth: a port to pass over.
				return &portlock.HeldError{Network: network, Addr: addr, Port: p, Bound: true}
			}
			return err
		}
		tb.Cleanup(func() {
			_ = c.Close()
			_ = l.Close()
		})
		return nil
	})
	return c
}
