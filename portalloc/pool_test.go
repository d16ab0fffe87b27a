package portalloc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/portalloc/pool"
)

// TestPoolTakeWritesNothing: Take works while another program holds the
// store's write lock, which any write would have to wait for.
func TestPoolTakeWritesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Timeout: time.Second})
	p, err := pool.New(ctx, a, "hot", pool.Spec{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	locker := startLocker(t, dir)
	before := a.Stats()
	start := time.Now()
	for range 3 {
		if _, err := p.Take(ctx); err != nil {
			t.Fatalf("Take with the store locked: %v", err)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Logf("3 takes took %v", d)
	}
	if after := a.Stats(); after.Errors != before.Errors {
		t.Errorf("Take touched the store: errors %+v -> %+v", before.Errors, after.Errors)
	}
	_ = locker.Close()
	_ = p.Close()
}

// TestStatsScript: a scripted sequence of allocations and failures on a
// small range, and every counter afterwards.
func TestStatsScript(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := freeRun(t, 6)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: portalloc.Range{First: base, Last: base + 1}, AllowEphemeralOverlap: true})
	foreign := listen(t, lo4, base+2) // outside the range, bound outside berth
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
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, portalloc.ErrRangeExhausted) { // dynamic error
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, base+2); !errors.Is(err, portalloc.ErrPortHeld) { // static error, probe failure
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, 0); !errors.Is(err, portalloc.ErrInvalidRequest) { // static error
		t.Fatal(err)
	}
	_, err = a.Reserve(ctx, portalloc.Request{}, base+3) // static ok
	must(err)
	// A worker's reservation, reaped once it is killed.
	holdInWorker(t, dir, lo4, base+4).kill(t)
	_, err = a.Reserve(ctx, portalloc.Request{}, base+4) // static ok, one row reaped
	must(err)

	want := portalloc.Stats{
		Backend:       portalloc.BackendStateStore,
		Held:          4,
		Allocations:   portalloc.ScopeCounts{Dynamic: 2, Static: 2},
		Errors:        portalloc.ScopeCounts{Dynamic: 1, Static: 2},
		ProbeFailures: 1,
		Reaped:        1,
	}
	if got := a.Stats(); got != want {
		t.Errorf("Stats() = %+v; want %+v", got, want)
	}
	u, err := expvarmetrics.ReadUsage(ctx, a)
	if err != nil || u != (expvarmetrics.Usage{Ports: 2, Reserved: 2, Available: 0}) {
		t.Errorf("Usage() = %+v, %v; want 2 ports, 2 reserved, 0 available", u, err)
	}

	// A fallback counts once.
	fbDir := t.TempDir()
	newerStore(t, fbDir)
	fb := newAllocator(t, portalloc.Config{StateDir: fbDir})
	_, err = fb.Allocate(ctx, portalloc.Request{})
	must(err)
	if st := fb.Stats(); st.Fallbacks != 1 || st.Backend != portalloc.BackendMRU || st.Allocations.Dynamic != 1 {
		t.Errorf("fallback Stats() = %+v", st)
	}

	// Metrics has both, as package expvarmetrics publishes them.
	if m := expvarmetrics.Read(ctx, a); m.Stats != want || m.Usage.Reserved != 2 || m.UsageError != "" {
		t.Errorf("Metrics() = %+v", m)
	}
}

// TestAllocatorCloseClosesPools: closing the Allocator stops its pools and
// leaves nothing reserved.
func TestAllocatorCloseClosesPools(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange})
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
	if _, err := p.Take(ctx); !errors.Is(err, portalloc.ErrClosed) {
		t.Errorf("Take after the Allocator closed = %v; want ErrClosed", err)
	}
	if got := rowsLabelled(t, dir, "pool:"); len(got) != 0 {
		t.Errorf("rows left after Close: %v", got)
	}
}
