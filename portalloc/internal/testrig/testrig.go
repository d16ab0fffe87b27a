// Package testrig is what the tests of portalloc and of its layers (pool,
// portset) share: Allocators on a state directory of the test's own, and
// runs of free ports, in the package's part of the test ports
// (internal/testports), whose lock the test binary holds.
package testrig

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

var (
	// Lo4 is 127.0.0.1.
	Lo4 = netip.MustParseAddr("127.0.0.1")
	// PickRange is where tests pick ports of their own (FreeRun), the
	// first third of the package's range; AllocRange, the rest, is the
	// range of the Allocators NewAllocator makes. Use sets them.
	PickRange, AllocRange store.Range
)

func init() { Use(testports.Portalloc) }

// Use makes r, the test ports of the package whose tests run (whose lock
// the test binary holds), the ranges of PickRange and AllocRange.
func Use(r testports.Range) {
	third := uint16(r.Size() / 3)
	PickRange = store.Range{First: r.First, Last: r.First + third - 1}
	AllocRange = store.Range{First: r.First + third, Last: r.Last}
}

// NewAllocator returns an Allocator for cfg, on a state directory of the
// test's own and AllocRange unless cfg says otherwise, closed with the
// test. It reads no BERTH_* variable.
func NewAllocator(tb testing.TB, cfg portalloc.Config) *portalloc.Allocator {
	tb.Helper()
	cfg.IgnoreEnv = true
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	if cfg.Range == (store.Range{}) {
		cfg.Range = AllocRange
	}
	a, err := portalloc.New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return a
}

// FreeRun finds n consecutive ports of PickRange that are all bindable and
// unlocked right now, and returns the first. It starts at a random run, so one test
// does not get the ports the last one used.
func FreeRun(tb testing.TB, n int) uint16 {
	tb.Helper()
	runs := PickRange.Size() / n
	start := rand.IntN(runs)
	for i := range runs {
		base := PickRange.First + uint16((start+i)%runs*n)
		ok := true
		for p := base; ok && p < base+uint16(n); p++ {
			l, err := net.Listen("tcp", netip.AddrPortFrom(Lo4, p).String())
			if err != nil {
				ok = false
				continue
			}
			_ = l.Close()
			// Nor locked: by a keeper an earlier test left to end on its
			// own, or a reservation this process keeps.
			lk, err := portlock.Acquire("tcp", netip.IPv4Unspecified(), p)
			if err != nil {
				ok = false
				continue
			}
			_ = lk.Close()
		}
		if ok {
			return base
		}
	}
	tb.Fatalf("no run of %d free ports in %v", n, PickRange)
	return 0
}

// ExampleAllocator opens an Allocator for an example, on a state directory
// of its own, in the 100 ports from first; the function it returns closes
// it and removes the directory.
func ExampleAllocator(first uint16) (*portalloc.Allocator, func()) {
	dir, _ := os.MkdirTemp("", "berth-example")
	a, err := portalloc.New(context.Background(), portalloc.Config{
		StateDir: dir, Mode: portalloc.ModeStateStore, IgnoreEnv: true,
		Range: store.Range{First: first, Last: first + 99},
	})
	if err != nil {
		fmt.Println(err)
		_ = os.RemoveAll(dir)
		return nil, func() {}
	}
	return a, func() { _ = a.Close(); _ = os.RemoveAll(dir) }
}
