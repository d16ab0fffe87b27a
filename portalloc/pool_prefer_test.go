package portalloc_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/pool"
)

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
	p := newTestPool(t, a, "prefer", pool.Spec{Size: 3, Prefer: []uint16{base, base + 1, base + 2, base + 3}})
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

// newTestPool makes a pool closed with the test; the pools' own tests are
// in package pool, these need this package's worker processes.
func newTestPool(tb testing.TB, a *portalloc.Allocator, name string, spec pool.Spec) *pool.Pool {
	tb.Helper()
	p, err := pool.New(context.Background(), a, name, spec)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// idlePorts returns the ports of p's idle members, in order.
func idlePorts(p *pool.Pool) []uint16 {
	var out []uint16
	for _, r := range p.Idle() {
		out = append(out, r.Port)
	}
	return out
}

// waitUpdated waits until p has its idle members and no update under way.
func waitUpdated(tb testing.TB, p *pool.Pool) pool.Status {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := p.Status()
		if !st.Updating && st.Replacing == 0 && st.Idle >= st.Size {
			return st
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the update did not finish: %+v (last error %v)", st, p.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
