package portalloc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
)

// TestEphemeralRangeCutOut: the part of Range inside the OS ephemeral range
// is left out of allocation, unless AllowEphemeralOverlap keeps it.
func TestEphemeralRangeCutOut(t *testing.T) {
	eph, err := portalloc.EphemeralRange()
	if err != nil || eph.First < 1100 {
		t.Skipf("skipping: the OS ephemeral range %v (%v) leaves no room below it", eph, err)
	}
	// 1,000 ports below the ephemeral range and 100 inside it.
	r := portalloc.Range{First: eph.First - 1000, Last: eph.First + 99}
	for _, e := range testports.All {
		if e.Package != "portalloc" && r.Overlaps(portalloc.Range(e.Range)) {
			t.Skipf("skipping: %v, at the foot of this host's ephemeral range %v, overlaps the test range of %s", r, eph, e.Package)
		}
	}
	ctx := context.Background()
	cut := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: r})
	if u, err := expvarmetrics.ReadUsage(ctx, cut); err != nil || u.Ports != 1000 {
		t.Errorf("Usage().Ports with the overlap cut out = %d, %v; want 1000", u.Ports, err)
	}
	for range 50 {
		got, err := cut.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Port >= eph.First {
			t.Fatalf("Allocate = %d, inside the ephemeral range %v", got.Port, eph)
		}
	}
	kept := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: r, AllowEphemeralOverlap: true})
	if u, err := expvarmetrics.ReadUsage(ctx, kept); err != nil || u.Ports != 1100 {
		t.Errorf("Usage().Ports with the overlap allowed = %d, %v; want 1100", u.Ports, err)
	}
}

// TestReserveInMRUMode: without a store, Reserve probes the port, refuses
// one that is bound, and remembers the one it hands out, so Allocate skips
// it.
func TestReserveInMRUMode(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 2)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeMRU, Range: portalloc.Range{First: base, Last: base + 1}, AllowEphemeralOverlap: true})
	l := listen(t, lo4, base+1)
	defer l.Close()
	_, err := a.Reserve(ctx, portalloc.Request{}, base+1)
	var ce *portalloc.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != 0 {
		t.Fatalf("Reserve of a bound port in MRU mode = %v; want a ConflictError for a process outside berth", err)
	}
	r, err := a.Reserve(ctx, portalloc.Request{}, base)
	if err != nil || r.Backend != portalloc.BackendMRU {
		t.Fatalf("Reserve of a free port in MRU mode = %+v, %v", r, err)
	}
	// base is recorded as handed out, base+1 is bound: nothing is left.
	if got, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, portalloc.ErrRangeExhausted) {
		t.Errorf("Allocate after Reserve = %+v, %v; want ErrRangeExhausted (the reserved port is recent)", got, err)
	}
	if st := a.Stats(); st.Allocations.Static != 1 || st.Errors.Static != 1 || st.ProbeFailures < 2 {
		t.Errorf("Stats() = %+v; want 1 static allocation, 1 static error, probe failures for the bound port", st)
	}
}

// TestDefaultRange: the zero Range is 20000-32767. Every test package's
// range lies inside it, so this test allocates nothing from it.
func TestDefaultRange(t *testing.T) {
	a, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got, want := a.Config().Range, (portalloc.Range{First: 20000, Last: 32767}); got != want || portalloc.DefaultRange != want {
		t.Errorf("Config().Range with a zero Range = %v, DefaultRange = %v; want %v", got, portalloc.DefaultRange, want)
	}
}
