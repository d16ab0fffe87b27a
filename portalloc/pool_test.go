package portalloc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/store"
)

// The pools' own tests are in package pool; these need this package's
// worker processes.

// newTestPool makes a pool closed with the test.
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

// TestPoolPrefer: a pool's members take its preferred ports first, in
// order, each with the full guarantee: one another process holds and one
// bound outside berth are passed over, and a member holding one is not
// given it again; then the range serves.
func TestPoolPrefer(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 12)
	dir := t.TempDir()
	rng := store.Range{First: base + 4, Last: base + 11}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true})

	holdInWorker(t, dir, lo4, base)          // reserved by another process
	defer mustListen(t, lo4, base+1).Close() // bound outside berth
	p := newTestPool(t, a, "prefer", pool.Spec{Size: 3, Prefer: []uint16{base, base + 1, base + 2, base + 3}})
	got := idlePorts(p)
	if len(got) != 3 || got[0] != base+2 || got[1] != base+3 || !rng.Contains(got[2]) {
		t.Fatalf("members of a pool preferring %d..%d = %v; want %d, %d (the free preferred ports, in order), then one of %v", base, base+3, got, base+2, base+3, rng)
	}

	// A member taken leaves its preferred port held: the refill passes it
	// over.
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

// TestPoolTakeWritesNothing: Take works while another program holds the
// store's write lock, which any write would have to wait for.
func TestPoolTakeWritesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Timeout: time.Second})
	p := newTestPool(t, a, "hot", pool.Spec{Size: 3})
	locker := holdSQLiteWriteLock(t, dir)
	before := a.Stats()
	var taken []store.Reservation
	for range 3 {
		r, err := p.Take(ctx)
		if err != nil {
			t.Fatalf("Take with the store locked: %v", err)
		}
		taken = append(taken, r)
	}
	if after := a.Stats(); after.Errors != before.Errors || after.Allocations != before.Allocations {
		t.Errorf("Take touched the store: %+v -> %+v", before, after)
	}
	_ = locker.Close()
	for _, r := range taken {
		if !bindable(t, r) {
			t.Errorf("a member taken, %v, is not bindable", r)
		}
	}
}

// TestAllocatorCloseClosesPools: closing the Allocator stops its pools and
// leaves nothing reserved.
func TestAllocatorCloseClosesPools(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange, IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(ctx, a, "closing", pool.Spec{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Take(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if _, err := p.Take(ctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Take after the Allocator closed = %v; want ErrClosed", err)
	}
	if err := p.Update(pool.Spec{Size: 3}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Update after the Allocator closed = %v; want ErrClosed", err)
	}
	if got := rowsLabelled(t, dir, "pool:"); len(got) != 0 {
		t.Errorf("rows left after Close: %v", got)
	}
	_ = p.Close()
}

// TestStatsScript: a scripted sequence of allocations and failures on a
// small range, and every counter afterwards.
func TestStatsScript(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := freeRun(t, 6)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: store.Range{First: base, Last: base + 1}, AllowEphemeralOverlap: true})
	foreign := mustListen(t, lo4, base+2) // outside the range, bound outside berth
	defer foreign.Close()

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := a.Allocate(ctx, portalloc.Request{}) // dynamic ok
	must(err)
	_, err = a.Allocate(ctx, portalloc.Request{}) // dynamic ok
	must(err)
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) { // dynamic error
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, base+2); !errors.Is(err, store.ErrHeld) { // static error, probe failure
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, 0); !errors.Is(err, store.ErrInvalid) { // static error
		t.Fatal(err)
	}
	_, err = a.Reserve(ctx, portalloc.Request{}, base+3) // static ok
	must(err)
	// A worker's reservation, reaped once it is killed.
	holdInWorker(t, dir, lo4, base+4).kill(t)
	_, err = a.Reserve(ctx, portalloc.Request{}, base+4) // static ok, one row reaped
	must(err)

	want := portalloc.Stats{
		Held:          4,
		Ports:         2,
		Allocations:   portalloc.Counts{Dynamic: 2, Static: 2},
		Errors:        portalloc.Counts{Dynamic: 1, Static: 2},
		ProbeFailures: 1,
		Reaped:        1,
	}
	if got := a.Stats(); got != want {
		t.Errorf("Stats() = %+v; want %+v", got, want)
	}
	ports, reserved, err := a.Usage(ctx)
	if err != nil || ports != 2 || reserved != 2 {
		t.Errorf("Usage() = %d, %d, %v; want 2 ports, 2 reserved", ports, reserved, err)
	}

	// A fallback counts once.
	fbDir := t.TempDir()
	newerStore(t, fbDir)
	fb := newAllocator(t, portalloc.Config{StateDir: fbDir, Logger: (&logCounter{}).logger()})
	_, err = fb.Allocate(ctx, portalloc.Request{})
	must(err)
	if st := fb.Stats(); st.Fallbacks != 1 || st.Fallback == "" || st.Allocations.Dynamic != 1 {
		t.Errorf("fallback Stats() = %+v", st)
	}
	if ports, reserved, err := fb.Usage(ctx); err != nil || ports != fb.Stats().Ports || reserved != 0 {
		t.Errorf("fallback Usage() = %d, %d, %v; want the ports, none reserved: the MRU file reserves nothing", ports, reserved, err)
	}
}
