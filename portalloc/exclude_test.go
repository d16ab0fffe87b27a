package portalloc_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// TestBrowserRestrictedSkipped: the ports browsers refuse (6665-6669 here)
// are never handed out from the range nor taken from Prefer by default;
// with Config.AllowBrowserRestricted they are; Reserve takes them either
// way.
func TestBrowserRestrictedSkipped(t *testing.T) {
	ctx := context.Background()
	rng := store.Range{First: 6664, Last: 6670} // 6665-6669 restricted
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, Order: portalloc.OrderLowest, AllowEphemeralOverlap: true})
	if st := a.Stats(); st.Ports != 2 {
		t.Errorf("Stats().Ports = %d; want 2: 6664 and 6670", st.Ports)
	}
	var got []uint16
	for {
		r, err := a.Allocate(ctx, portalloc.Request{Prefer: []uint16{6666}})
		if errors.Is(err, store.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Port)
	}
	slices.Sort(got)
	if want := []uint16{6664, 6670}; !slices.Equal(got, want) {
		t.Errorf("Allocate in %v (Prefer 6666) until exhausted = %v; want %v, no restricted port", rng, got, want)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, 6667); err != nil {
		t.Errorf("Reserve(6667) = %v; want it taken: a port asked for by number is chosen", err)
	}

	// a's ports are locked for as long as it holds them, whatever store
	// another Allocator uses: let them go.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, Order: portalloc.OrderLowest, AllowBrowserRestricted: true, AllowEphemeralOverlap: true})
	r, err := b.Allocate(ctx, portalloc.Request{Prefer: []uint16{6666}})
	if err != nil || r.Port != 6666 {
		t.Errorf("with AllowBrowserRestricted, Allocate(Prefer 6666) = %v, %v; want 6666", r.Port, err)
	}
	got = nil
	for {
		r, err := b.Allocate(ctx, portalloc.Request{})
		if errors.Is(err, store.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Port)
	}
	if want := []uint16{6664, 6665, 6667, 6668, 6669, 6670}; !slices.Equal(got, want) {
		t.Errorf("with AllowBrowserRestricted, Allocate in %v (lowest first) until exhausted = %v; want %v", rng, got, want)
	}
}
