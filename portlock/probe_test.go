package portlock_test

import (
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/berth-go/berth/portlock"
)

func hasIPv6(tb testing.TB) {
	tb.Helper()
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		tb.Skipf("skipping: this host has no IPv6 loopback (%v)", err)
	}
	_ = l.Close()
}

func checkProbe(tb testing.TB, network string, addr netip.Addr, port uint16, want bool) {
	tb.Helper()
	got, err := portlock.Probe(network, addr, port)
	if err != nil || got != want {
		tb.Errorf("Probe(%s, %v, %d) = %v, %v; want %v, nil", network, addr, port, got, err, want)
	}
}

func TestProbeTCP(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) {
			if host == "::1" {
				hasIPv6(t)
			}
			l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				t.Fatal(err)
			}
			ap := netip.MustParseAddrPort(l.Addr().String())
			checkProbe(t, "tcp", ap.Addr(), ap.Port(), false)
			// Another protocol on the same port is a different resource.
			checkProbe(t, "udp", ap.Addr(), ap.Port(), true)
			_ = l.Close()
			checkProbe(t, "tcp", ap.Addr(), ap.Port(), true)
		})
	}
}

func TestProbeUDP(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) {
			if host == "::1" {
				hasIPv6(t)
			}
			c, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
			if err != nil {
				t.Fatal(err)
			}
			ap := netip.MustParseAddrPort(c.LocalAddr().String())
			checkProbe(t, "udp", ap.Addr(), ap.Port(), false)
			_ = c.Close()
			checkProbe(t, "udp", ap.Addr(), ap.Port(), true)
		})
	}
}

// TestProbeAgreesWithListen checks that the probe gives the answer a Go listener
// would get, for every pair of holder and requested address: the kernel is
// the referee, and kernels differ on how IPv4 wildcards meet IPv6 sockets.
func TestProbeAgreesWithListen(t *testing.T) {
	addrs := []string{"127.0.0.1", "0.0.0.0"}
	if l, err := net.Listen("tcp", "[::1]:0"); err == nil {
		_ = l.Close()
		addrs = append(addrs, "::1", "::")
	} else {
		t.Logf("this host has no IPv6 loopback; checking IPv4 only (%v)", err)
	}
	for _, held := range addrs {
		for _, want := range addrs {
			l, err := net.Listen("tcp", net.JoinHostPort(held, "0"))
			if err != nil {
				t.Fatal(err)
			}
			port := netip.MustParseAddrPort(l.Addr().String()).Port()
			got, err := portlock.Probe("tcp", netip.MustParseAddr(want), port)
			if err != nil {
				t.Fatal(err)
			}
			l2, lerr := net.Listen("tcp", net.JoinHostPort(want, strconv.Itoa(int(port))))
			if lerr == nil {
				_ = l2.Close()
			}
			if got != (lerr == nil) {
				t.Errorf("with %s:%d held, Available(tcp, %s) = %v; net.Listen error = %v", held, port, want, got, lerr)
			}
			_ = l.Close()
		}
	}
}

// TestProbeTimeWait checks that a port whose connection lingers in TIME_WAIT
// probes free, as a Go listener can bind it.
func TestProbeTimeWait(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(l.Addr().String())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err == nil {
			_ = c.Close() // the server closes first, so it holds TIME_WAIT
		}
	}()
	c, err := net.Dial("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	<-done
	_, _ = c.Read(make([]byte, 1))
	_ = c.Close()
	_ = l.Close()
	checkProbe(t, "tcp", ap.Addr(), ap.Port(), true)
	l2, err := net.Listen("tcp", ap.String())
	if err != nil {
		t.Fatalf("net.Listen after a free probe: %v", err)
	}
	_ = l2.Close()
}

func TestProbeBadInput(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	tests := []struct {
		network string
		addr    netip.Addr
		port    uint16
	}{
		{"sctp", lo, 1},
		{"tcp", netip.Addr{}, 1},
		{"tcp", netip.MustParseAddr("fe80::1%lo"), 1},
		{"tcp", lo, 0},
	}
	for _, tt := range tests {
		if got, err := portlock.Probe(tt.network, tt.addr, tt.port); err == nil {
			t.Errorf("Probe(%q, %v, %d) = %v, nil; want error", tt.network, tt.addr, tt.port, got)
		}
	}
}

// TestProbeNoAddress checks that an address this host does not have is an error,
// not "unavailable": it says nothing about the port.
func TestProbeNoAddress(t *testing.T) {
	_, err := portlock.Probe("tcp", netip.MustParseAddr("192.0.2.1"), 20000)
	if err == nil {
		t.Error("Probe(tcp, 192.0.2.1 (TEST-NET, not on this host)) error = nil; want EADDRNOTAVAIL")
	}
}

// BenchmarkProbe is one bind probe of a port the OS picked, in its
// ephemeral range: the other packages' tests bind below it.
func BenchmarkProbe(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ap := netip.MustParseAddrPort(l.Addr().String())
	_ = l.Close()
	for range b.N {
		if _, err := portlock.Probe("tcp", ap.Addr(), ap.Port()); err != nil {
			b.Fatal(err)
		}
	}
}
