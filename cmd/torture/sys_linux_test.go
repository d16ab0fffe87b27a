package main

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestBoundBy(t *testing.T) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
	got := boundBy("udp", port)
	if want := os.Args[0] + " pid " + strconv.Itoa(os.Getpid()); !strings.Contains(got, want) || !strings.HasPrefix(got, " (1 sockets on the port") {
		t.Errorf("boundBy(udp, %d) = %q; want one socket, of %q", port, got, want)
	}
	_ = c.Close()
	if got := boundBy("udp", port); got != " (0 sockets on the port, held by [])" {
		t.Errorf("boundBy(udp, %d) after close = %q; want none", port, got)
	}
}
