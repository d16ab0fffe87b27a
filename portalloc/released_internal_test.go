//go:build linux

package portalloc

import (
	"context"
	"net/netip"
	"testing"

	"github.com/berth-go/berth/store"
)

// TestReleasedKeptBounded (Linux: all of 127.0.0.0/8 is bound there): the
// record keeps at most maxReleased releases
// done (for a failover that brings their rows back), the latest among
// them, however many the process makes.
func TestReleasedKeptBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("makes more releases than the record keeps")
	}
	ctx := context.Background()
	a, err := New(ctx, Config{StateDir: t.TempDir(), Mode: ModeStateStore, Range: store.Range{First: 29170, Last: 29179},
		AllowEphemeralOverlap: true, IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close() }()
	var last store.Key
	for i := range maxReleased + maxReleased/2 {
		// One key each: an address of 127.0.0.0/8 of its own.
		addr := netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)})
		r, err := a.Reserve(ctx, Request{Addr: addr}, 29170)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
		last = r.Key
	}
	a.h.mu.Lock()
	defer a.h.mu.Unlock()
	n := 0
	for _, e := range a.h.held {
		if !e.released.IsZero() {
			n++
		}
	}
	if n > maxReleased {
		t.Errorf("the record keeps %d releases; want at most %d", n, maxReleased)
	}
	if e := a.h.held[last]; e == nil || e.released.IsZero() {
		t.Errorf("the latest release, of %v, is not in the record", last)
	}
}
