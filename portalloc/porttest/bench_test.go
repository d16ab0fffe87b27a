package porttest_test

import (
	"net"
	"testing"

	"github.com/berth-go/berth/portalloc/porttest"
)

// BenchmarkPort is what a test pays for each port after the first in its
// binary: the shared Allocator is open already, so it is one allocation
// from the store (and, at the end, one release). The ports are held until
// the benchmark ends, so keep -benchtime within the package's 1,000-port
// test range (e.g. -benchtime=500x). BenchmarkListen, a bare listen and
// close on port 0, is what users compare it with.
func BenchmarkPort(b *testing.B) {
	porttest.Port(b) // opens the shared Allocator
	for b.Loop() {
		porttest.Port(b)
	}
}

func BenchmarkListen(b *testing.B) {
	for b.Loop() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		_ = l.Close()
	}
}
