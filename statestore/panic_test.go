package statestore_test

import (
	"context"
	"testing"

	"github.com/berth-go/berth/store"
)

// TestPanickingProbeLeavesStoreUsable: a probe that panics inside the write
// transaction rolls it back and goes on as a panic; the caller recovers, and
// the next write of the same Store works and nothing of the failed one
// remains.
func TestPanickingProbeLeavesStoreUsable(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	for _, scan := range []bool{false, true} {
		func() {
			defer func() {
				if p := recover(); p != "probe exploded" {
					t.Fatalf("recovered %v; want the probe's panic to go on", p)
				}
			}()
			probe := func(store.Key) error { panic("probe exploded") }
			if scan {
				next := func() (uint16, bool) { return 30100, true }
				_, _ = s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: next, Probe: probe})
			} else {
				_, _ = s.Reserve(ctx, store.Request{Key: tcp(lo4, 30100), Probe: probe})
			}
			t.Fatal("the probe's panic did not reach the caller")
		}()
		if rs := list(t, s); len(rs) != 0 {
			t.Fatalf("after a panicking probe (scan %v) the store holds %v; want nothing", scan, rs)
		}
		r, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 30101)})
		if err != nil {
			t.Fatalf("Reserve after a panicking probe (scan %v) = %v; want it to work", scan, err)
		}
		if err := s.Release(ctx, r.Key, store.Owner{}); err != nil {
			t.Fatal(err)
		}
	}
}
