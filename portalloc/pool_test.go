package portalloc_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
)

func TestParseMaxUnavailable(t *testing.T) {
	tests := []struct {
		s    string
		size int
		want int
	}{
		{"25%", 10, 3}, {"25%", 4, 1}, {"50%", 10, 5}, {"3", 10, 3}, {"0", 10, 1},
		{"10%", 9, 1}, {"", 8, 2}, {"100%", 7, 7}, {"0%", 5, 1},
	}
	for _, tt := range tests {
		if got, err := portalloc.ParseMaxUnavailable(tt.s, tt.size); err != nil || got != tt.want {
			t.Errorf("ParseMaxUnavailable(%q, %d) = %d, %v; want %d", tt.s, tt.size, got, err, tt.want)
		}
	}
	for _, bad := range []string{"abc", "-1", "150%", "%", "1.5", " 3", "3 ", "+3", "25%%"} {
		if got, err := portalloc.ParseMaxUnavailable(bad, 10); !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("ParseMaxUnavailable(%q) = %d, %v; want ErrInvalidRequest", bad, got, err)
		}
	}
}

// poolRig is an Allocator over a range with two halves: pools start on the
// first and roll to the second.
func poolRig(t *testing.T) (*portalloc.Allocator, portalloc.Range, portalloc.Range) {
	t.Helper()
	base := freeRun(t, 40)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: portalloc.Range{First: base, Last: base + 39}, AllowEphemeralOverlap: true})
	return a, portalloc.Range{First: base, Last: base + 19}, portalloc.Range{First: base + 20, Last: base + 39}
}

func waitUpdated(t *testing.T, p *portalloc.Pool) portalloc.PoolStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := p.Status()
		if !st.Updating && st.Replacing == 0 && st.Idle >= st.Size {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the update did not finish: %+v (last error %v)", st, p.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newTestPool makes a pool on a's first range, closed with the test, and
// returns a function that lists the rolling update steps taken so far.
func newTestPool(t *testing.T, a *portalloc.Allocator, name string, spec portalloc.PoolSpec) (*portalloc.Pool, func() []portalloc.StepInfo) {
	t.Helper()
	p, err := a.NewPool(context.Background(), name, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	var (
		mu    sync.Mutex
		steps []portalloc.StepInfo
	)
	p.OnStep(func(s portalloc.StepInfo) { mu.Lock(); steps = append(steps, s); mu.Unlock() })
	return p, func() []portalloc.StepInfo {
		mu.Lock()
		defer mu.Unlock()
		return append([]portalloc.StepInfo(nil), steps...)
	}
}

// TestPoolRollingUpdate: a pool of 4 at 25% rolls to a new range one
// member per step, never more than one out at a time, while another
// goroutine keeps taking and returning members.
func TestPoolRollingUpdate(t *testing.T) {
	ctx := context.Background()
	a, first, second := poolRig(t)
	p, steps := newTestPool(t, a, "web", portalloc.PoolSpec{Size: 4, Range: first})
	st := p.Status()
	if st.Idle != 4 || st.Updated != 4 || st.Updating {
		t.Fatalf("new pool status %+v", st)
	}
	oldRev := st.Revision

	stop := make(chan struct{})
	var churnErr atomic.Value
	var churned atomic.Int64
	var maxReplacing atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // takes and returns throughout
		defer wg.Done()
		if err := takeReturn(ctx, p, stop, &churned); err != nil {
			churnErr.Store(err)
		}
	}()
	go func() { // watches how many are out at once
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := int64(p.Status().Replacing); n > maxReplacing.Load() {
				maxReplacing.Store(n)
			}
		}
	}()

	if err := p.Update(portalloc.PoolSpec{Size: 4, Range: second}); err != nil {
		t.Fatal(err)
	}
	waitUpdated(t, p)
	close(stop)
	wg.Wait()
	st = waitUpdated(t, p) // the last member taken is back
	if err, _ := churnErr.Load().(error); err != nil {
		t.Fatalf("Take/Return during the update: %v", err)
	}
	if st.Revision == oldRev || st.Updated != 4 || st.Idle != 4 || st.InUse != 0 {
		t.Errorf("status after the update %+v; want 4 idle members, all at the new revision", st)
	}
	// One member per step. A member in use when its turn came is not
	// stepped: returned to a full pool, it is released instead, so there
	// may be fewer than 4 steps.
	taken := steps()
	if len(taken) == 0 {
		t.Error("no rolling update step was taken")
	}
	for i, s := range taken {
		if s.Budgeted != 1 || s.Unavailable != 0 {
			t.Errorf("step %d replaced %d by budget and %d unavailable; want 1 and 0", i, s.Budgeted, s.Unavailable)
		}
	}
	if maxReplacing.Load() > 1 {
		t.Errorf("%d members were out at once; want at most 1", maxReplacing.Load())
	}
	t.Logf("%d steps, %d take/return rounds during the update", len(taken), churned.Load())
	for range 4 {
		r, err := p.Take(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !second.Contains(r.Port) {
			t.Errorf("after the update Take = %d; want a port in %v", r.Port, second)
		}
	}
}

// TestPoolInUseNotRevoked: a member in use keeps its port and reservation
// through an update, and is replaced only after it is returned.
func TestPoolInUseNotRevoked(t *testing.T) {
	ctx := context.Background()
	a, first, second := poolRig(t)
	p, err := a.NewPool(ctx, "db", portalloc.PoolSpec{Size: 2, Range: first, MaxUnavailable: "100%"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	held, err := p.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Update(portalloc.PoolSpec{Size: 2, Range: second, MaxUnavailable: "100%"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := p.Status(); st.Updated != 2 || st.Replacing > 0; st = p.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("idle members not updated: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := p.Status()
	if !st.Updating || st.InUse != 1 {
		t.Errorf("status with an old member in use = %+v; want still updating", st)
	}
	// Still reserved by this process: another Allocator of the process
	// conflicts on the wildcard.
	if _, err := a.Reserve(ctx, portalloc.Request{Address: any4}, held.Port); !errors.Is(err, portalloc.ErrPortHeld) {
		t.Errorf("the in-use member's port %d is not reserved any more: %v", held.Port, err)
	}
	if err := p.Return(held); err != nil {
		t.Fatal(err)
	}
	st = waitUpdated(t, p)
	if st.Updating || st.Updated != 2 {
		t.Errorf("after Return: %+v", st)
	}
}

// TestPoolUnavailableMemberReplaced: a member whose port a program outside
// berth has bound is replaced without spending the update's budget.
func TestPoolUnavailableMemberReplaced(t *testing.T) {
	a, first, second := poolRig(t)
	p, steps := newTestPool(t, a, "cache", portalloc.PoolSpec{Size: 4, Range: first})
	// A program outside berth binds an idle member's port.
	idle := p.Idle()
	if len(idle) != 4 {
		t.Fatalf("Idle() = %v; want 4 members", idle)
	}
	squat := listen(t, idle[0].Address, idle[0].Port)
	defer squat.Close()
	idleSquat := idle[0].Port
	if err := p.Update(portalloc.PoolSpec{Size: 4, Range: second}); err != nil {
		t.Fatal(err)
	}
	waitUpdated(t, p)
	unavailable := 0
	for i, s := range steps() {
		unavailable += s.Unavailable
		if s.Budgeted > 1 {
			t.Errorf("step %d used %d of a budget of 1", i, s.Budgeted)
		}
	}
	if unavailable != 1 {
		t.Errorf("%d members replaced as unavailable; want 1 (port %d). Steps: %+v", unavailable, idleSquat, steps())
	}
}

// TestPoolTakeWritesNothing: Take works while another program holds the
// store's write lock, which any write would have to wait for.
func TestPoolTakeWritesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Timeout: time.Second})
	p, err := a.NewPool(ctx, "hot", portalloc.PoolSpec{Size: 3})
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

func TestPoolBands(t *testing.T) {
	ctx := context.Background()
	// A range of 4,096 ports or more has a static band of 128 at its low end.
	r := portalloc.Range(testports.Portalloc)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: r})
	for band, want := range map[string]portalloc.Range{
		"static":  {First: r.First, Last: r.First + 127},
		"dynamic": {First: r.First + 128, Last: r.Last},
	} {
		p, err := a.NewPool(ctx, band, portalloc.PoolSpec{Size: 3, Band: band})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Idle() {
			if !want.Contains(r.Port) {
				t.Errorf("band %s: member port %d; want one in %v", band, r.Port, want)
			}
		}
		_ = p.Close()
	}
}

func TestPoolBadSpec(t *testing.T) {
	a, _, _ := poolRig(t)
	for _, spec := range []portalloc.PoolSpec{
		{Band: "middle"},
		{Band: "static", Range: portalloc.Range{First: 20000, Last: 20010}},
		{Size: -1},
		{Range: portalloc.Range{First: 10, Last: 20}},
		{MaxUnavailable: "abc"},
		{Protocol: "sctp"},
		{Size: 100},
	} {
		if p, err := a.NewPool(context.Background(), "bad", spec); !errors.Is(err, portalloc.ErrInvalidRequest) {
			if p != nil {
				_ = p.Close()
			}
			t.Errorf("NewPool(%+v) = %v; want ErrInvalidRequest", spec, err)
		}
	}
	if len(a.Held()) != 0 {
		t.Errorf("bad specs left reservations: %v", a.Held())
	}
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
	u, err := a.Usage(ctx)
	if err != nil || u != (portalloc.Usage{Ports: 2, Reserved: 2, Available: 0}) {
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
	if m := a.Metrics(ctx); m.Stats != want || m.Usage.Reserved != 2 || m.UsageError != "" {
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
	p, err := a.NewPool(ctx, "closing", portalloc.PoolSpec{Size: 3})
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

// TestPoolNeverOverfills: takers that find the pool empty allocate on the
// spot, and their Returns refill it while the pool's own refill is under
// way; neither may leave more idle members than the pool's size (each one
// a port reserved for nobody).
func TestPoolNeverOverfills(t *testing.T) {
	ctx := context.Background()
	a, first, _ := poolRig(t)
	const size = 2
	p, err := a.NewPool(ctx, "busy", portalloc.PoolSpec{Size: size, Range: first})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			if err := takeReturn(ctx, p, stop, nil); err != nil {
				t.Error(err)
			}
		})
	}
	end := time.Now().Add(time.Second)
	worst := 0
	for time.Now().Before(end) {
		worst = max(worst, p.Status().Idle)
	}
	close(stop)
	wg.Wait()
	if worst > size {
		t.Errorf("the pool of %d held %d idle members at once", size, worst)
	}
}

// takeReturn takes a member and returns it, over and over, until stop is
// closed or a call fails; rounds, when not nil, counts the rounds.
func takeReturn(ctx context.Context, p *portalloc.Pool, stop <-chan struct{}, rounds *atomic.Int64) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		r, err := p.Take(ctx)
		if err != nil {
			return err
		}
		if err := p.Return(r); err != nil {
			return err
		}
		if rounds != nil {
			rounds.Add(1)
		}
	}
}
