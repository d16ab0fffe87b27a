package pool_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
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
		if got, err := pool.ParseMaxUnavailable(tt.s, tt.size); err != nil || got != tt.want {
			t.Errorf("ParseMaxUnavailable(%q, %d) = %d, %v; want %d", tt.s, tt.size, got, err, tt.want)
		}
	}
	for _, bad := range []string{"abc", "-1", "150%", "%", "1.5", " 3", "3 ", "+3", "25%%"} {
		if got, err := pool.ParseMaxUnavailable(bad, 10); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ParseMaxUnavailable(%q) = %d, %v; want ErrInvalidRequest", bad, got, err)
		}
	}
}

// poolRig is an Allocator over a range with two halves: pools start on the
// first and roll to the second.
func poolRig(tb testing.TB) (*portalloc.Allocator, store.Range, store.Range) {
	tb.Helper()
	base := freeRun(tb, 40)
	a := newAllocator(tb, portalloc.Config{Mode: portalloc.ModeStateStore, Range: store.Range{First: base, Last: base + 39}, AllowEphemeralOverlap: true})
	return a, store.Range{First: base, Last: base + 19}, store.Range{First: base + 20, Last: base + 39}
}

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

// newTestPool makes a pool on a's first range, closed with the test, and
// returns a function that lists the rolling update steps taken so far.
func newTestPool(tb testing.TB, a *portalloc.Allocator, name string, spec pool.Spec) (*pool.Pool, func() []pool.StepInfo) {
	tb.Helper()
	p, err := pool.New(context.Background(), a, name, spec)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	var (
		mu    sync.Mutex
		steps []pool.StepInfo
	)
	p.OnStep(func(s pool.StepInfo) { mu.Lock(); steps = append(steps, s); mu.Unlock() })
	return p, func() []pool.StepInfo {
		mu.Lock()
		defer mu.Unlock()
		return append([]pool.StepInfo(nil), steps...)
	}
}

// TestPoolRollingUpdate: a pool of 4 at 25% rolls to a new range one
// member per step, never more than one out at a time, while another
// goroutine keeps taking and returning members.
func TestPoolRollingUpdate(t *testing.T) {
	ctx := context.Background()
	a, first, second := poolRig(t)
	p, steps := newTestPool(t, a, "web", pool.Spec{Size: 4, Range: first})
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

	if err := p.Update(pool.Spec{Size: 4, Range: second}); err != nil {
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
	p, err := pool.New(ctx, a, "db", pool.Spec{Size: 2, Range: first, MaxUnavailable: "100%"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	held, err := p.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Update(pool.Spec{Size: 2, Range: second, MaxUnavailable: "100%"}); err != nil {
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
	if _, err := a.Reserve(ctx, portalloc.Request{Addr: netip.IPv4Unspecified()}, held.Port); !errors.Is(err, store.ErrHeld) {
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
	p, steps := newTestPool(t, a, "cache", pool.Spec{Size: 4, Range: first})
	// A program outside berth binds an idle member's port.
	idle := p.Idle()
	if len(idle) != 4 {
		t.Fatalf("Idle() = %v; want 4 members", idle)
	}
	squat := listen(t, idle[0].Addr, idle[0].Port)
	defer squat.Close()
	idleSquat := idle[0].Port
	if err := p.Update(pool.Spec{Size: 4, Range: second}); err != nil {
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

func TestPoolSegments(t *testing.T) {
	ctx := context.Background()
	// A range of 4,096 ports or more has a static segment of 128 at its low end.
	// That is portalloc's range, under its lock for this test.
	testports.Hold(t, testports.Portalloc)
	r := store.Range(testports.Portalloc)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: r})
	for _, tt := range []struct {
		spec pool.Spec
		want store.Range
	}{
		{pool.Spec{Size: 3, Segment: "static"}, store.Range{First: r.First, Last: r.First + 127}},
		{pool.Spec{Size: 3, Segment: "dynamic"}, store.Range{First: r.First + 128, Last: r.Last}},
	} {
		p, err := pool.New(ctx, a, "seg", tt.spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Idle() {
			if !tt.want.Contains(m.Port) {
				t.Errorf("pool.New(%+v): member port %d; want one in %v", tt.spec, m.Port, tt.want)
			}
		}
		_ = p.Close()
	}
}

// TestPoolSegmentRefused: a segment that names none is refused with a
// *FieldError naming the field.
func TestPoolSegmentRefused(t *testing.T) {
	a, _, _ := poolRig(t)
	for _, tt := range []struct {
		spec      pool.Spec
		wantField string
	}{
		{pool.Spec{Segment: "middle"}, "Spec.Segment"},
	} {
		p, err := pool.New(context.Background(), a, "bad", tt.spec)
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.wantField || !errors.Is(err, store.ErrInvalid) {
			if p != nil {
				_ = p.Close()
			}
			t.Errorf("pool.New(%+v) = %v; want a *FieldError for %s", tt.spec, err, tt.wantField)
		}
	}
}

// TestPoolBadSpec: a refused spec or name is one *FieldError naming the
// field, in an error with the package's prefix once, and leaves nothing
// reserved.
func TestPoolBadSpec(t *testing.T) {
	a, _, _ := poolRig(t)
	for _, tc := range []struct {
		name  string
		spec  pool.Spec
		field string
	}{
		{"bad", pool.Spec{Segment: "middle"}, "Spec.Segment"},
		{"bad", pool.Spec{Segment: "static", Range: store.Range{First: 20000, Last: 20010}}, "Spec.Segment"},
		{"bad", pool.Spec{Size: -1}, "Spec.Size"},
		{"bad", pool.Spec{Range: store.Range{First: 10, Last: 20}}, "Spec.Range"},
		{"bad", pool.Spec{Range: store.Range{First: 20, Last: 10}}, "Spec.Range"},
		{"bad", pool.Spec{MaxUnavailable: "abc"}, "Spec.MaxUnavailable"},
		{"bad", pool.Spec{Protocol: "sctp"}, "Spec.Protocol"},
		{"bad", pool.Spec{Size: 100}, "Spec.Size"},
		{"bad", pool.Spec{Order: "up"}, "Spec.Order"},
		{"bad", pool.Spec{Prefer: []uint16{3000, 0}}, "Spec.Prefer[1]"},
		{"bad name", pool.Spec{}, "name"},
	} {
		p, err := pool.New(context.Background(), a, tc.name, tc.spec)
		if p != nil {
			_ = p.Close()
		}
		if !refused(err, tc.field) {
			t.Errorf("New(%q, %+v) = %v; want a *FieldError for %s with the prefix once", tc.name, tc.spec, err, tc.field)
		}
	}
	if len(a.Held()) != 0 {
		t.Errorf("bad specs left reservations: %v", a.Held())
	}
	p, _ := newTestPool(t, a, "twice", pool.Spec{Size: 1})
	if p2, err := pool.New(context.Background(), a, "twice", pool.Spec{Size: 1}); !refused(err, "name") {
		if p2 != nil {
			_ = p2.Close()
		}
		t.Errorf("New of a name an open pool has = %v; want a *FieldError for name", err)
	}
	if err := p.Return(store.Reservation{Key: store.Key{Protocol: store.TCP, Port: 1}}); !refused(err, "Reservation") {
		t.Errorf("Return of a port the pool never handed out = %v; want a *FieldError for Reservation", err)
	}
	if _, err := pool.ParseMaxUnavailable("1.5", 4); !refused(err, "max unavailable") {
		t.Errorf(`ParseMaxUnavailable("1.5", 4) = %v; want a *FieldError for max unavailable`, err)
	}
}

// refused reports whether err refuses field as every call of the package
// refuses input: one *FieldError with a Want, wrapping ErrInvalidRequest,
// in a message with the prefix "portalloc: " once.
func refused(err error, field string) bool {
	var fe *store.FieldError
	return errors.As(err, &fe) && fe.Field == field && fe.Want != "" && errors.Is(err, store.ErrInvalid) &&
		strings.HasPrefix(err.Error(), "portalloc: ") && strings.Count(err.Error(), "portalloc: ") == 1
}

// TestPoolNeverOverfills: takers that find the pool empty allocate on the
// spot, and their Returns refill it while the pool's own refill is under
// way; neither may leave more idle members than the pool's size (each one
// a port reserved for nobody).
func TestPoolNeverOverfills(t *testing.T) {
	ctx := context.Background()
	a, first, _ := poolRig(t)
	const size = 2
	p, err := pool.New(ctx, a, "busy", pool.Spec{Size: size, Range: first})
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
func takeReturn(ctx context.Context, p *pool.Pool, stop <-chan struct{}, rounds *atomic.Int64) error {
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

func idlePorts(p *pool.Pool) []uint16 {
	var out []uint16
	for _, r := range p.Idle() {
		out = append(out, r.Port)
	}
	return out
}

// TestPoolOrderLowest: a pool with OrderLowest fills with the low end of
// its range, in ascending order, and refills with the next free port up,
// on an Allocator whose own order is random.
func TestPoolOrderLowest(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 10)
	rng := store.Range{First: base, Last: base + 9}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, AllowEphemeralOverlap: true})
	p, _ := newTestPool(t, a, "low", pool.Spec{Size: 4, Order: portalloc.OrderLowest})
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
	p, steps := newTestPool(t, a, "roll", pool.Spec{Size: 2, Range: first})
	rev := p.Status().Revision
	if err := p.Update(pool.Spec{Size: 2, Range: first, Order: portalloc.OrderRandom}); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.Revision != rev || st.Updating {
		t.Errorf("status after an update that spells out the default order: %+v; want revision %s, not updating", st, rev)
	}

	want := second.First + 5
	if err := p.Update(pool.Spec{Size: 2, Range: first, Prefer: []uint16{want}}); err != nil {
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
		spec pool.Spec
		want string
	}{
		{pool.Spec{Order: "up"}, `Spec.Order "up": want "random" or "lowest"`},
		{pool.Spec{Prefer: []uint16{3000, 0}}, `Spec.Prefer[1] "0": want a port from 1 to 65535`},
		{pool.Spec{Prefer: make([]uint16, portalloc.MaxPrefer+1)}, `Spec.Prefer "1025 ports": want at most 1024 ports (MaxPrefer)`},
	} {
		p, err := pool.New(ctx, a, "bad", tc.spec)
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewPool(Order %q, %d preferred) = %v; want ErrInvalidRequest saying %q", tc.spec.Order, len(tc.spec.Prefer), err, tc.want)
		}
		if p != nil {
			_ = p.Close()
		}
	}
	p, _ := newTestPool(t, a, "good", pool.Spec{Size: 2, Range: first})
	rev := p.Status().Revision
	if err := p.Update(pool.Spec{Size: 2, Range: first, Order: "up"}); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "Spec.Order") {
		t.Errorf("Update with Order up = %v; want ErrInvalidRequest naming Spec.Order", err)
	}
	if st := p.Status(); st.Revision != rev || st.Updating {
		t.Errorf("status after a refused Update: %+v; want revision %s, not updating", st, rev)
	}
	if len(a.Held()) != 2 {
		t.Errorf("Held() = %v; want the good pool's 2 members", a.Held())
	}
}

// TestCloseWithRowGone: a member whose row another tool deleted under the
// pool (as berth release would) is let go by Pool.Close and by the
// Allocator's Close that closes the pool, without an error: nothing is
// left to delete, and the member's lock goes, so another process can
// reserve the port again.
func TestCloseWithRowGone(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 4)
	for _, closer := range []string{"Pool.Close", "Allocator.Close"} {
		dir := t.TempDir()
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, IgnoreEnv: true,
			Range: store.Range{First: base, Last: base + 3}, AllowEphemeralOverlap: true})
		if err != nil {
			t.Fatal(err)
		}
		p, err := pool.New(ctx, a, "lost", pool.Spec{Size: 1})
		if err != nil {
			_ = a.Close()
			t.Fatal(err)
		}
		st, err := statestore.Open(ctx, filepath.Join(dir, "berth.db"), statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		m := p.Idle()[0]
		if err := st.Release(ctx, m.Key, store.Owner{}); err != nil {
			t.Fatal(err)
		}
		_ = st.Close()
		if closer == "Pool.Close" {
			err = p.Close()
			if aerr := a.Close(); aerr != nil {
				t.Errorf("Allocator.Close after Pool.Close = %v; want nil", aerr)
			}
		} else {
			err = a.Close()
		}
		if err != nil {
			t.Errorf("%s with a member's row gone = %v; want nil", closer, err)
		}
		lk, err := portlock.Acquire("tcp", m.Addr, m.Port)
		if err != nil {
			t.Errorf("after %s, lock of port %d: %v; want it let go", closer, m.Port, err)
		} else {
			_ = lk.Close()
		}
	}
}
