package portset_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
)

// The sets' examples bind ports in portalloc's test range, under its
// lock: they run when portalloc's own tests do not. The sets' tests that
// need other processes stay with portalloc's, which run them as workers.
var (
	lo4        = netip.MustParseAddr("127.0.0.1")
	pickRange  = portalloc.Range{First: testports.Portalloc.First, Last: testports.Portalloc.First + 1999}
	allocRange = portalloc.Range{First: testports.Portalloc.First + 2000, Last: testports.Portalloc.Last}
)

func TestMain(m *testing.M) {
	if _, err := testports.Lock(testports.Portalloc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// exampleAllocator opens an Allocator on a state directory of its own, in a
// part of the test range.
func exampleAllocator(first uint16) (*portalloc.Allocator, func()) {
	dir, _ := os.MkdirTemp("", "berth-example")
	a, err := portalloc.New(context.Background(), portalloc.Config{
		StateDir: dir, Mode: portalloc.ModeStateStore,
		Range: portalloc.Range{First: first, Last: first + 99},
	})
	if err != nil {
		fmt.Println(err)
		os.RemoveAll(dir)
		return nil, func() {}
	}
	return a, func() { _ = a.Close(); os.RemoveAll(dir) }
}

// newAllocator returns an Allocator for cfg, on a state directory of the
// test's own and allocRange unless cfg says otherwise, closed with the
// test.
func newAllocator(tb testing.TB, cfg portalloc.Config) *portalloc.Allocator {
	tb.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	if cfg.Range == (portalloc.Range{}) {
		cfg.Range = allocRange
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

// freeRun returns the first port of n consecutive ports of pickRange that
// are bindable now.
func freeRun(tb testing.TB, n int) uint16 {
	tb.Helper()
	runs := pickRange.Size() / n
	start := rand.IntN(runs)
	for i := range runs {
		base := pickRange.First + uint16((start+i)%runs*n)
		ok := true
		for p := base; p < base+uint16(n); p++ {
			l, err := net.Listen("tcp", netip.AddrPortFrom(lo4, p).String())
			if err != nil {
				ok = false
				break
			}
			_ = l.Close()
		}
		if ok {
			return base
		}
	}
	tb.Fatalf("no run of %d free ports in %v", n, pickRange)
	return 0
}
