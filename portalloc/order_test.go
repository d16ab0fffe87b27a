package portalloc_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// TestPrefer: preferred ports are tried first, in order, each with the full
// guarantee: one another process holds and one bound outside berth are
// passed over; with none free, the range serves.
func TestPrefer(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 10)
	dir := t.TempDir()
	rng := store.Range{First: base + 5, Last: base + 9}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true})

	holdInWorker(t, dir, lo4, base)          // reserved by another process
	defer mustListen(t, lo4, base+1).Close() // bound outside berth
	r, err := a.Allocate(ctx, portalloc.Request{Prefer: []uint16{base, base + 1, base + 2, base + 3}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Port != base+2 {
		t.Errorf("Allocate with Prefer %d..%d = %d; want %d, the first preferred port that is free", base, base+3, r.Port, base+2)
	}
	// Outside the range is allowed: the caller chose it.
	r, err = a.Allocate(ctx, portalloc.Request{Prefer: []uint16{base + 3}})
	if err != nil || r.Port != base+3 {
		t.Errorf("Allocate with Prefer %d (outside the range) = %v, %v", base+3, r, err)
	}
	// Every preferred port taken: the range serves.
	r, err = a.Allocate(ctx, portalloc.Request{Prefer: []uint16{base, base + 1, base + 2}})
	if err != nil || !rng.Contains(r.Port) {
		t.Errorf("Allocate with every preferred port taken = %v, %v; want a port of %v", r, err, rng)
	}
}

// TestOrderLowest: lowest-first hands out the range from its first port
// up, by Config or per Request, and skips what is held.
func TestOrderLowest(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 40)
	rng := store.Range{First: base, Last: base + 39}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest})
	for i := range uint16(3) {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Port != base+i {
			t.Errorf("allocation %d = %d; want %d", i, r.Port, base+i)
		}
	}
	if err := a.Close(); err != nil { // its ports are locked while it holds them, whatever the store
		t.Fatal(err)
	}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, AllowEphemeralOverlap: true})
	r, err := b.Allocate(ctx, portalloc.Request{Order: portalloc.OrderLowest})
	if err != nil || r.Port != base {
		t.Errorf("Allocate with Request.Order lowest on an Allocator of its own = %v, %v; want %d", r, err, base)
	}
	// A port another process holds is skipped, lowest first or not.
	holdInWorker(t, b.Config().StateDir, lo4, base+1)
	r, err = b.Allocate(ctx, portalloc.Request{Order: portalloc.OrderLowest})
	if err != nil || r.Port != base+2 {
		t.Errorf("Allocate lowest-first beside the other process's %d = %v, %v; want %d", base+1, r, err, base+2)
	}
}

// TestWithin: Request.Within narrows Allocate to a part of the range; a
// Within outside the range is refused.
func TestWithin(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 20)
	rng := store.Range{First: base, Last: base + 19}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, AllowEphemeralOverlap: true})
	within := store.Range{First: base + 10, Last: base + 12}
	var got []uint16
	for {
		r, err := a.Allocate(ctx, portalloc.Request{Within: within})
		if errors.Is(err, store.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Port)
	}
	slices.Sort(got)
	if want := []uint16{base + 10, base + 11, base + 12}; !slices.Equal(got, want) {
		t.Errorf("Allocate within %v until exhausted = %v; want %v", within, got, want)
	}
	if r, err := a.Allocate(ctx, portalloc.Request{}); err != nil || within.Contains(r.Port) {
		t.Errorf("Allocate of the whole range = %v, %v; want a port outside the full part", r, err)
	}
	for _, bad := range []store.Range{{First: base - 1, Last: base + 5}, {First: base + 5, Last: base + 20}, {First: base + 5, Last: base + 1}} {
		var fe *store.FieldError
		if _, err := a.Allocate(ctx, portalloc.Request{Within: bad}); !errors.As(err, &fe) || fe.Field != "Request.Within" {
			t.Errorf("Allocate(Within %v) of %v = %v; want a *FieldError for Request.Within", bad, rng, err)
		}
	}
}

func TestOrderAndPreferInvalid(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	for _, tc := range []struct {
		req  portalloc.Request
		want string
	}{
		{portalloc.Request{Order: "fast"}, `Request.Order "fast": want "random" or "lowest"`},
		{portalloc.Request{Prefer: []uint16{3000, 0}}, `Request.Prefer[1] "0": want a port from 1 to 65535`},
		{portalloc.Request{Prefer: make([]uint16, portalloc.MaxPrefer+1)}, `Request.Prefer "1025 ports": want at most 1024 ports`},
	} {
		_, err := a.Allocate(ctx, tc.req)
		var fe *store.FieldError
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &fe) {
			t.Errorf("Allocate(%+v) = %v; want a *FieldError (ErrInvalid) saying %q", tc.req.Order, err, tc.want)
		}
	}
	_, err := portalloc.New(ctx, portalloc.Config{StateDir: t.TempDir(), Order: "up", IgnoreEnv: true})
	if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), `Config.Order "up": want "random" or "lowest"`) {
		t.Errorf("New with Order up = %v", err)
	}
}

// TestPreferAndOrderInMRUMode: the MRU file walks the same candidates.
func TestPreferAndOrderInMRUMode(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 10)
	rng := store.Range{First: base + 5, Last: base + 9}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeMRU, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest})
	r, err := a.Allocate(ctx, portalloc.Request{Prefer: []uint16{base + 1}})
	if err != nil || r.Port != base+1 {
		t.Errorf("MRU Allocate with Prefer %d = %v, %v", base+1, r, err)
	}
	r, err = a.Allocate(ctx, portalloc.Request{})
	if err != nil || r.Port != base+5 {
		t.Errorf("MRU Allocate lowest-first = %v, %v; want %d", r, err, base+5)
	}
}

// TestSetPrefer: a set spec's prefer list is tried in order, each member
// of a per-member port taking the next free one, and order lowest takes
// the range from its low end.
func TestSetPrefer(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 10)
	rng := store.Range{First: base + 5, Last: base + 9}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, AllowEphemeralOverlap: true})
	set, err := portset.Allocate(ctx, a, portset.SetSpec{Name: "prefer", Groups: []portset.GroupSpec{
		{Name: "web", Members: 3, Ports: []portset.PortSpec{{Name: "http", Prefer: []uint16{base, base + 1}, Order: portalloc.OrderLowest}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint16
	for _, m := range set.Members() {
		got = append(got, m.Ports["http"].Port)
	}
	slices.Sort(got)
	if want := []uint16{base, base + 1, base + 5}; !slices.Equal(got, want) {
		t.Errorf("ports of the three members = %v; want %v (the two preferred, then the range's lowest)", got, want)
	}
}
