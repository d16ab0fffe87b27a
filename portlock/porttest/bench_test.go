package porttest_test

import (
	"net"
	"testing"

	"github.com/berth-go/berth/portlock/porttest"
)

// BenchmarkPort compares a port from porttest (its lock, the wildcard
// check and a bind probe, let go at the test's end) with what users
// compare it with: a bare net.Listen("tcp", "127.0.0.1:0") and Close, in
// the same run.
func BenchmarkPort(b *testing.B) {
	b.Run("porttest", func(b *testing.B) {
		for range b.N {
			f := &fakeTB{TB: b}
			porttest.Port(f)
			for i := len(f.cleanups) - 1; i >= 0; i-- {
				f.cleanups[i]()
			}
		}
	})
	b.Run("listen", func(b *testing.B) {
		for range b.N {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			_ = l.Close()
		}
	})
}
