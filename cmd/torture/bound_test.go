package main

import (
	"context"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestBoundBy: a refused bind names the socket in the way and the pid
// that holds it.
func TestBoundBy(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("skipping: only Linux shows which process binds a port")
	}
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
	got := boundBy(context.Background(), "udp", port)
	for _, want := range []string{"Local:127.0.0.1:" + strconv.Itoa(int(port)), "PID:" + strconv.Itoa(os.Getpid())} {
		if !strings.Contains(got, want) {
			t.Errorf("boundBy(udp, %d) = %q; want it to hold %q", port, got, want)
		}
	}
	_ = c.Close()
	if got := boundBy(context.Background(), "udp", port); !strings.HasPrefix(got, " (sockets [], locks [], error <nil>)") {
		t.Errorf("boundBy(udp, %d) after close = %q; want nothing", port, got)
	}
}
