package portalloc_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
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
	rng := portalloc.Range{First: base, Last: base + 11}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest})
	defer listen(t, lo4, base+1).Close() // bound outside berth
	holdInWorker(t, dir, lo4, base+5)    // held by another process

	rs, err := a.AllocateBlock(ctx, portalloc.Request{Label: "rtp"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Lowest first: base..base+2 has base+1 bound, base+2.. base+4 is the
	// first block with neither.
	for i, r := range rs {
		if want := base + 2 + uint16(i); r.Port != want {
			t.Errorf("block[%d] = %d; want %d", i, r.Port, want)
		}
		l, err := net.Listen("tcp", r.AddrPort().String())
		if err != nil {
			t.Errorf("block port %d is not bindable: %v", r.Port, err)
		} else {
			_ = l.Close()
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
	if _, err := b.AllocateBlock(ctx, portalloc.Request{}, 3); !errors.Is(err, portalloc.ErrRangeExhausted) {
		t.Errorf("a third block in a full range = %v; want ErrRangeExhausted", err)
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

// TestAllocateBlockRace: goroutines of two Allocators on one store take
// blocks at once; no port is in two blocks, and every port binds.
func TestAllocateBlockRace(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir}
	as := []*portalloc.Allocator{newAllocator(t, cfg), newAllocator(t, cfg)}
	var (
		mu   sync.Mutex
		seen = map[uint16]bool{}
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
					if seen[r.Port] {
						t.Errorf("port %d handed out twice", r.Port)
					}
					seen[r.Port] = true
					if i > 0 && r.Port != rs[i-1].Port+1 {
						t.Errorf("block %v is not consecutive", rs)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for p := range seen {
		l, err := net.Listen("tcp", netip.AddrPortFrom(lo4, p).String())
		if err != nil {
			t.Errorf("port %d is not bindable: %v", p, err)
			continue
		}
		_ = l.Close()
	}
}

func TestAllocateBlockInvalid(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	for _, n := range []int{0, -1, store.MaxBlock + 1} {
		if _, err := a.AllocateBlock(ctx, portalloc.Request{}, n); !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("AllocateBlock(%d) = %v; want ErrInvalidRequest", n, err)
		}
	}
	m := newAllocator(t, portalloc.Config{Mode: portalloc.ModeMRU})
	if _, err := m.AllocateBlock(ctx, portalloc.Request{}, 2); !errors.Is(err, portalloc.ErrStoreUnavailable) {
		t.Errorf("AllocateBlock in MRU mode = %v; want ErrStoreUnavailable", err)
	}
}
