package portalloc_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
)

func idlePorts(p *portalloc.Pool) []uint16 {
	var out []uint16
	for _, r := range p.Idle() {
		out = append(out, r.Port)
	}
	return out
}

// TestPoolPrefer: a pool's members take its preferred ports first, in
// order, each with the full guarantee: one another process holds and one
// bound outside berth are passed over, and a member holding one is not
// given it again; then the range serves.
func TestPoolPrefer(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 12)
	dir := t.TempDir()
	rng := portalloc.Range{First: base + 4, Last: base + 11}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true})

	holdInWorker(t, dir, lo4, base)      // reserved by another process
	defer listen(t, lo4, base+1).Close() // bound outside berth
	p, _ := newTestPool(t, a, "prefer", portalloc.PoolSpec{Size: 3, Prefer: []uint16{base, base + 1, base + 2, base + 3}})
	got := idlePorts(p)
	if len(got) != 3 || got[0] != base+2 || got[1] != base+3 || !rng.Contains(got[2]) {
		t.Fatalf("members of a pool preferring %d..%d = %v; want %d, %d (the free preferred ports, in order), then one of %v", base, base+3, got, base+2, base+3, rng)
	}

	// A member taken leaves its preferred port held: the refill passes it
	// over. Once returned and the pool shrunk, the port is free again.
	r, err := p.Take(ctx)
	if err != nil || r.Port != base+2 {
		t.Fatalf("Take = %v, %v; want the first member, port %d", r, err, base+2)
	}
	st := waitUpdated(t, p)
	if st.Idle != 3 || st.InUse != 1 {
		t.Fatalf("after Take: %+v; want 3 idle and 1 in use", st)
	}
	for _, port := range idlePorts(p) {
		if port == base+2 {
			t.Errorf("the refill took port %d, which the member in use holds; idle %v", port, idlePorts(p))
		}
	}
}

// TestPoolOrderLowest: a pool with OrderLowest fills with the low end of
// its range, in ascending order, and refills with the next free port up,
// on an Allocator whose own order is random.
func TestPoolOrderLowest(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 10)
	rng := portalloc.Range{First: base, Last: base + 9}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, AllowEphemeralOverlap: true})
	p, _ := newTestPool(t, a, "low", portalloc.PoolSpec{Size: 4, Order: portalloc.OrderLowest})
	if got, want := idlePorts(p), []uint16{base, base + 1, base + 2, base + 3}; !slices.Equal(got, want) {
		t.Fatalf("members of a lowest-first pool = %v; want %v", got, want)
	}
	if _, err := p.Take(ctx); err != nil {
		t.Fatal(err)
	}
	waitUpdated(t, p)
	if got := idlePorts(p); !slices.Contains(got, base+4) {
		t.Errorf("idle members after a Take and the refill = %v; want %d, the next port up, among them", got, base+4)
	}
}

// TestPoolPreferUpdate: a change of Prefer rolls the pool to the preferred
// port; spelling out the Allocator's order is no change.
func TestPoolPreferUpdate(t *testing.T) {
	a, first, second := poolRig(t)
	p, steps := newTestPool(t, a, "roll", portalloc.PoolSpec{Size: 2, Range: first})
	rev := p.Status().Revision
	if err := p.Update(portalloc.PoolSpec{Size: 2, Range: first, Order: portalloc.OrderRandom}); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.Revision != rev || st.Updating {
		t.Errorf("status after an update that spells out the default order: %+v; want revision %s, not updating", st, rev)
	}

	want := second.First + 5
	if err := p.Update(portalloc.PoolSpec{Size: 2, Range: first, Prefer: []uint16{want}}); err != nil {
		t.Fatal(err)
	}
	st := waitUpdated(t, p)
	if st.Revision == rev {
		t.Errorf("revision after a change of Prefer = %s; want a new one", st.Revision)
	}
	if len(steps()) == 0 {
		t.Error("a change of Prefer took no rolling update step")
	}
	got := idlePorts(p)
	if !slices.Contains(got, want) {
		t.Errorf("members after the update to Prefer %d = %v; want it among them", want, got)
	}
	for _, port := range got {
		if port != want && !first.Contains(port) {
			t.Errorf("member port %d; want %d or one of %v", port, want, first)
		}
	}
}

// TestPoolPreferOrderInvalid: bad values are refused with the field
// named, by NewPool and by Update, which keeps the spec it had.
func TestPoolPreferOrderInvalid(t *testing.T) {
	ctx := context.Background()
	a, first, _ := poolRig(t)
	for _, tc := range []struct {
		spec portalloc.PoolSpec
		want string
	}{
		{portalloc.PoolSpec{Order: "up"}, `PoolSpec.Order "up": want "random" or "lowest"`},
		{portalloc.PoolSpec{Prefer: []uint16{3000, 0}}, "PoolSpec.Prefer[1] is 0: want ports from 1 to 65535"},
		{portalloc.PoolSpec{Prefer: make([]uint16, portalloc.MaxPrefer+1)}, "PoolSpec.Prefer lists 1025 ports: want at most 1024 (MaxPrefer)"},
	} {
		p, err := a.NewPool(ctx, "bad", tc.spec)
		if !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewPool(Order %q, %d preferred) = %v; want ErrInvalidRequest saying %q", tc.spec.Order, len(tc.spec.Prefer), err, tc.want)
		}
		if p != nil {
			_ = p.Close()
		}
	}
	p, _ := newTestPool(t, a, "good", portalloc.PoolSpec{Size: 2, Range: first})
	rev := p.Status().Revision
	if err := p.Update(portalloc.PoolSpec{Size: 2, Range: first, Order: "up"}); !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), "PoolSpec.Order") {
		t.Errorf("Update with Order up = %v; want ErrInvalidRequest naming PoolSpec.Order", err)
	}
	if st := p.Status(); st.Revision != rev || st.Updating {
		t.Errorf("status after a refused Update: %+v; want revision %s, not updating", st, rev)
	}
	if len(a.Held()) != 2 {
		t.Errorf("Held() = %v; want the good pool's 2 members", a.Held())
	}
}
