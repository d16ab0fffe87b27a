package portalloc_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// TestAllocateBlock: a block is n consecutive bindable ports of the range,
// all reserved; a base whose block has a port bound outside berth, or held
// by another process, is passed over; Release frees each port.
func TestAllocateBlock(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 12)
	dir := t.TempDir()
	rng := store.Range{First: base, Last: base + 11}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest})
	defer mustListen(t, lo4, base+1).Close() // bound outside berth
	holdInWorker(t, dir, lo4, base+5)        // held by another process

	rs, err := a.AllocateBlock(ctx, portalloc.Request{Label: "rtp"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Lowest first: base..base+2 has base+1 bound, base+2..base+4 is the
	// first block with neither.
	for i, r := range rs {
		if want := base + 2 + uint16(i); r.Port != want || r.Label != "rtp" {
			t.Errorf("block[%d] = %v; want port %d labelled rtp", i, r, want)
		}
		if !bindable(t, r) {
			t.Errorf("block port %d is not bindable", r.Port)
		}
	}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest})
	rs2, err := b.AllocateBlock(ctx, portalloc.Request{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if rs2[0].Port != base+6 {
		t.Errorf("second block starts at %d; want %d, after the first block and the other process's port", rs2[0].Port, base+6)
	}
	if _, err := b.AllocateBlock(ctx, portalloc.Request{}, 3); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("a third block in a full range = %v; want ErrExhausted", err)
	}
	for _, r := range rs {
		if err := a.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.AllocateBlock(ctx, portalloc.Request{}, 3); err != nil {
		t.Errorf("a block after the first was released = %v", err)
	}
}

// TestAllocateBlockPrefer: a preferred base is tried first and may lie
// outside the range, as may its block.
func TestAllocateBlockPrefer(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 8)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: store.Range{First: base + 4, Last: base + 7}, AllowEphemeralOverlap: true})
	rs, err := a.AllocateBlock(ctx, portalloc.Request{Prefer: []uint16{base}}, 3)
	if err != nil || len(rs) != 3 || rs[0].Port != base || rs[2].Port != base+2 {
		t.Fatalf("AllocateBlock(3, Prefer %d) = %v, %v; want %d..%d", base, rs, err, base, base+2)
	}
}

// TestAllocateBlockRace: goroutines of two Allocators on one store take
// blocks at once; no port is in two blocks, and every port binds.
func TestAllocateBlockRace(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir}
	as := []*portalloc.Allocator{newAllocator(t, cfg), newAllocator(t, cfg)}
	var (
		mu   sync.Mutex
		seen = map[uint16]store.Reservation{}
		wg   sync.WaitGroup
	)
	for g := range 8 {
		wg.Go(func() {
			for range 5 {
				rs, err := as[g%2].AllocateBlock(ctx, portalloc.Request{}, 4)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, r := range rs {
					if _, dup := seen[r.Port]; dup {
						t.Errorf("port %d handed out twice", r.Port)
					}
					seen[r.Port] = r
					if i > 0 && r.Port != rs[i-1].Port+1 {
						t.Errorf("block %v is not consecutive", rs)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != 8*5*4 {
		t.Errorf("%d ports in blocks; want %d", len(seen), 8*5*4)
	}
	for _, r := range seen {
		if !bindable(t, r) {
			t.Errorf("port %d is not bindable", r.Port)
		}
	}
}

func TestAllocateBlockInvalid(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	for _, n := range []int{0, -1, store.MaxBlock + 1} {
		var fe *store.FieldError
		if _, err := a.AllocateBlock(ctx, portalloc.Request{}, n); !errors.As(err, &fe) || fe.Field != "n" {
			t.Errorf("AllocateBlock(%d) = %v; want a *FieldError for n", n, err)
		}
	}
	m := newAllocator(t, portalloc.Config{Mode: portalloc.ModeMRU})
	if _, err := m.AllocateBlock(ctx, portalloc.Request{}, 2); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("AllocateBlock in MRU mode = %v; want ErrUnavailable", err)
	}
	if h := m.Held(); len(h) != 0 {
		t.Errorf("Held() after a refused block = %v; want none", h)
	}
}
