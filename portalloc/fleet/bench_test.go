package fleet_test

import (
	"context"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// BenchmarkAllocateRelease: an Allocate and its Release through fleet.New's
// Allocator on the PostgreSQL store BERTH_TEST_POSTGRES names: a lock, a
// bind-probe and a round trip each, and the round trip of the release.
func BenchmarkAllocateRelease(b *testing.B) {
	dsn, _ := fleetDSN(b)
	base := freeRun(b, 16)
	a := newFleet(b, portalloc.Config{StoreDSN: dsn, Host: "bench", Range: store.Range{First: base, Last: base + 15}})
	ctx := context.Background()
	for b.Loop() {
		r, err := a.Allocate(ctx, portalloc.Request{Label: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Release(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}
