// Package pool keeps ports of an Allocator reserved ahead of time, so
// that a hot path takes one without touching the state store, and rolls
// them to a new spec a few at a time.
//
// A Pool's members are reservations of its Allocator (package portalloc)
// like any other, labelled "pool:<name>", with the full guarantee: locked,
// free in the store and bind-probed when reserved, and probed again while
// idle. The pool uses the Allocator's exported methods only: its members
// are the Allocator's holds, which the Allocator's Close releases, and its
// background work stops with the Allocator (Allocator.Done).
//
// After the Allocator's Close, New, Take, Return and Update return errors
// wrapping store.ErrClosed; Close is idempotent; Status, Idle and Err stay
// valid.
package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/names"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// Spec describes a pool's members. The zero value of every field is a
// working default.
type Spec struct {
	// Size is how many idle members the pool keeps ready; zero: 4.
	Size int
	// Range is where members are allocated, within the Allocator's range;
	// zero: the Allocator's range, or the segment Segment names.
	Range store.Range
	// Segment, instead of Range, names a segment of the Allocator's range,
	// as Kubernetes splits its service port range: "static", the low end,
	// kept for callers that Reserve fixed ports (1/32 of the range, at
	// least 16 and at most 128 ports; none in a range of 16 ports or
	// fewer), or "dynamic", the rest, where Allocate looks first.
	Segment string
	// Addr and Protocol are the members'; zero: 127.0.0.1 and TCP.
	Addr     netip.Addr
	Protocol store.Protocol
	// MaxUnavailable bounds how many idle members a rolling update
	// replaces at once: an integer ("3") or a percentage of Size ("25%",
	// rounded up), at least 1; zero: "25%".
	MaxUnavailable string
	// Prefer lists ports for every member allocated (filling, refilling,
	// rolling, or a Take of an empty pool) to take first, as
	// portalloc.Request.Prefer does: the first free one, then a port of
	// Range in Order. At most MaxPrefer ports, none of them 0.
	Prefer []uint16
	// Order is the order in which members walk Range after Prefer:
	// OrderRandom or OrderLowest (members from the low end up); zero: the
	// Allocator's portalloc.Config.Order.
	Order portalloc.Order
}

// ParseMaxUnavailable returns how many members of a pool of size may be
// replaced at once: s is an integer or a percentage of size, rounded up;
// at least 1. The empty string means 25%. A refused s is a
// *store.FieldError for "max unavailable".
func ParseMaxUnavailable(s string, size int) (int, error) {
	n, err := parseMaxUnavailable("max unavailable", s, size)
	return n, opError("", err)
}

// parseMaxUnavailable is ParseMaxUnavailable for field, without the prefix.
func parseMaxUnavailable(field, s string, size int) (int, error) {
	if s == "" {
		s = "25%"
	}
	bad := func() (int, error) {
		return 0, &store.FieldError{Field: field, Value: s, Want: `a whole number such as "3" or a percentage from 0% to 100% such as "25%"`}
	}
	num, pct := strings.CutSuffix(s, "%")
	for _, c := range num {
		if c < '0' || c > '9' {
			return bad()
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || num == "" {
		return bad()
	}
	if pct {
		if n > 100 {
			return bad()
		}
		n = int(math.Ceil(float64(n) * float64(size) / 100))
	}
	return max(n, 1), nil
}

// revision is a short hash of what makes a member: where it is allocated,
// and which ports it takes first. s has its defaults filled in, so a spec
// that spells out a default is the same revision as one that leaves it zero.
func (s Spec) revision() string {
	canon, _ := json.Marshal(struct {
		Range    string
		Address  string
		Protocol store.Protocol
		Prefer   []uint16
		Order    portalloc.Order
	}{s.Range.String(), s.Addr.String(), s.Protocol, s.Prefer, s.Order})
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:4])
}

// Status is a snapshot of a pool.
type Status struct {
	Size      int
	Idle      int
	InUse     int
	Updated   int    // members, idle or in use, at the current revision
	Revision  string // of the current spec
	Updating  bool   // while members of an older revision remain
	Replacing int    // idle members being replaced right now
}

// member is one reserved port of a pool.
type member struct {
	r        store.Reservation
	revision string
	created  time.Time
}

// Pool keeps ports reserved ahead of time, so that Take hands one out
// without touching the state store. It is safe for concurrent use.
//
// Rolling updates: Update changes the spec; the pool then replaces idle
// members of the old revision in steps of at most MaxUnavailable at a time.
// Idle members whose bind probe fails (a program outside berth took the
// port) are replaced without using that budget. Members in use are never
// revoked: they are replaced after they are returned. Each step replaces,
// in this order, unavailable members, then the oldest, then by port.
type Pool struct {
	name string
	a    *portalloc.Allocator

	mu        sync.Mutex // guards the fields below
	spec      Spec
	rev       string
	budget    int
	idle      []*member
	inUse     map[store.Key]*member
	replacing int
	closed    bool
	lastErr   error
	lastProbe time.Time // when idle members' ports were last probed

	wake chan struct{} // capacity 1: asks the worker to refill or step
	stop chan struct{}
	done chan struct{}

	onStep func(StepInfo) // see OnStep
}

// StepInfo describes one rolling update step.
type StepInfo struct {
	Replaced    []uint16 // old ports given up in this step
	Unavailable int      // members replaced because their probe failed, outside the budget
	Budgeted    int      // the others: at most MaxUnavailable
	Status      Status   // after the step
}

// New reserves spec.Size ports of a labelled "pool:<name>" and keeps them
// ready. It returns once the pool is full.
//
// The name is the pool's within the Allocator: a name that an open pool
// of the Allocator has already is refused with a *store.FieldError (two
// pools of one name would share a label and tell their members apart by
// nothing). Once a pool is closed its name may be used again. Names follow
// the rules of set names (see package portset). After a's Close, New
// returns an error wrapping store.ErrClosed.
func New(ctx context.Context, a *portalloc.Allocator, name string, spec Spec) (_ *Pool, err error) {
	defer func() { err = opError("new pool "+names.QuoteShort(name), err) }()
	if err := names.Check("name", name); err != nil {
		return nil, err
	}
	select {
	case <-a.Done():
		return nil, store.ErrClosed
	default:
	}
	if !claim(a, name) {
		return nil, &store.FieldError{Field: "name", Value: name, Want: "a name no open pool of this Allocator has; close that pool first or choose another name"}
	}
	p := &Pool{name: name, a: a, inUse: map[store.Key]*member{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	fail := func(err error) (*Pool, error) {
		for _, m := range p.idle {
			_ = a.Release(ctx, m.r) // it goes on whatever became of ctx; reaping covers a failure
		}
		unclaim(a, name)
		return nil, err
	}
	if err := p.setSpec(spec); err != nil {
		return fail(err)
	}
	for p.need() > 0 {
		if err := p.refillOne(ctx); err != nil {
			return fail(err)
		}
	}
	go p.work() //nolint:contextcheck // the pool outlives New's context; Close, or the Allocator's, stops it
	return p, nil
}

// pools are the names of the open pools, by Allocator.
var pools = struct {
	mu sync.Mutex
	m  map[*portalloc.Allocator]map[string]bool
}{m: map[*portalloc.Allocator]map[string]bool{}}

// claim takes name among a's pools if it is free.
func claim(a *portalloc.Allocator, name string) bool {
	pools.mu.Lock()
	defer pools.mu.Unlock()
	if pools.m[a][name] {
		return false
	}
	if pools.m[a] == nil {
		pools.m[a] = map[string]bool{}
	}
	pools.m[a][name] = true
	return true
}

func unclaim(a *portalloc.Allocator, name string) {
	pools.mu.Lock()
	defer pools.mu.Unlock()
	delete(pools.m[a], name)
	if len(pools.m[a]) == 0 {
		delete(pools.m, a)
	}
}

// setSpec validates spec and makes it current. A refused field is a
// *store.FieldError for "Spec.<field>".
func (p *Pool) setSpec(spec Spec) error {
	if spec.Size == 0 {
		spec.Size = 4
	}
	if spec.Size < 0 {
		return &store.FieldError{Field: "Spec.Size", Value: strconv.Itoa(spec.Size), Want: "1 or more (zero: 4)"}
	}
	segment := spec.Segment
	ar := p.a.Config().Range
	static, dynamic := segments(ar)
	switch {
	case segment != "" && segment != "static" && segment != "dynamic":
		return &store.FieldError{Field: "Spec.Segment", Value: segment, Want: `"static" or "dynamic" (or empty: the Allocator's range, or Range)`}
	case segment != "" && spec.Range != (store.Range{}):
		return &store.FieldError{Field: "Spec.Segment", Value: segment, Want: fmt.Sprintf("no segment beside a Range (Range is %s): one of them", spec.Range)}
	case segment == "static" && static.Size() == 0:
		return &store.FieldError{Field: "Spec.Segment", Value: segment, Want: fmt.Sprintf(`"dynamic"; the Allocator's range %s is too small to have a static segment (17 ports or more)`, ar)}
	case segment == "static":
		spec.Range = static
	case segment == "dynamic":
		spec.Range = dynamic
	case spec.Range == (store.Range{}):
		spec.Range = ar
	}
	if err := spec.Range.Validate(); err != nil {
		var fe *store.FieldError
		if errors.As(err, &fe) {
			named := *fe
			named.Field = "Spec.Range"
			return &named
		}
		return err
	}
	if !ar.Contains(spec.Range.First) || !ar.Contains(spec.Range.Last) {
		return &store.FieldError{Field: "Spec.Range", Value: spec.Range.String(), Want: fmt.Sprintf("a range inside the Allocator's %s", ar)}
	}
	if spec.Range.Size() < spec.Size {
		return &store.FieldError{Field: "Spec.Size", Value: strconv.Itoa(spec.Size), Want: fmt.Sprintf("at most %d, the ports of %s", spec.Range.Size(), spec.Range)}
	}
	switch spec.Protocol {
	case "":
		spec.Protocol = store.TCP
	case store.TCP, store.UDP:
	default:
		return &store.FieldError{Field: "Spec.Protocol", Value: string(spec.Protocol), Want: `"tcp" or "udp"`}
	}
	if !spec.Addr.IsValid() {
		spec.Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	if spec.Addr.Zone() != "" {
		return &store.FieldError{Field: "Spec.Addr", Value: spec.Addr.String(), Want: "an IPv4 or IPv6 address without a zone, such as 127.0.0.1, ::1, 0.0.0.0 or ::"}
	}
	spec.Addr = spec.Addr.Unmap()
	budget, err := parseMaxUnavailable("Spec.MaxUnavailable", spec.MaxUnavailable, spec.Size)
	if err != nil {
		return err
	}
	switch {
	case spec.Order == "":
		spec.Order = p.a.Config().Order
	case spec.Order != portalloc.OrderRandom && spec.Order != portalloc.OrderLowest:
		return &store.FieldError{Field: "Spec.Order", Value: string(spec.Order), Want: fmt.Sprintf("%q or %q", portalloc.OrderRandom, portalloc.OrderLowest)}
	}
	if len(spec.Prefer) > portalloc.MaxPrefer {
		return &store.FieldError{Field: "Spec.Prefer", Value: fmt.Sprintf("%d ports", len(spec.Prefer)), Want: fmt.Sprintf("at most %d ports (MaxPrefer)", portalloc.MaxPrefer)}
	}
	if i := slices.Index(spec.Prefer, 0); i >= 0 {
		return &store.FieldError{Field: fmt.Sprintf("Spec.Prefer[%d]", i), Value: "0", Want: "a port from 1 to 65535"}
	}
	// The pool's own copy, since the caller may reuse its slice; nil when
	// empty, so that an empty list and none are one revision.
	if len(spec.Prefer) == 0 {
		spec.Prefer = nil
	}
	spec.Prefer = slices.Clone(spec.Prefer)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shut() {
		return store.ErrClosed
	}
	p.spec, p.rev, p.budget = spec, spec.revision(), budget
	return nil
}

// segments returns the static (low) and dynamic (high) segments of r, as
// the Allocator walks them (see portrange).
func segments(r store.Range) (static, dynamic store.Range) {
	n := portrange.StaticSegmentSize(r.Size())
	if n == 0 {
		return store.Range{}, r
	}
	split := r.First + uint16(n)
	return store.Range{First: r.First, Last: split - 1}, store.Range{First: split, Last: r.Last}
}

// need is how many idle members are missing. p.mu must not be held.
func (p *Pool) need() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.spec.Size - len(p.idle) - p.replacing
}

func (p *Pool) allocate(ctx context.Context) (*member, error) {
	p.mu.Lock()
	spec, rev := p.spec, p.rev
	p.mu.Unlock()
	req := portalloc.Request{Protocol: spec.Protocol, Addr: spec.Addr, Label: "pool:" + p.name, Prefer: spec.Prefer, Order: spec.Order, Within: spec.Range}
	r, err := p.a.Allocate(ctx, req)
	if err != nil {
		return nil, err
	}
	return &member{r: r, revision: rev, created: time.Now()}, nil
}

func (p *Pool) refillOne(ctx context.Context) error {
	m, err := p.allocate(ctx)
	if err != nil {
		return err
	}
	// A Take may have allocated one on the spot meanwhile, and its Return
	// filled the pool: then this one goes back.
	p.mu.Lock()
	closed := p.shut()
	keep := !closed && len(p.idle)+p.replacing < p.spec.Size
	if keep {
		p.idle = append(p.idle, m)
	}
	p.mu.Unlock()
	if keep {
		return nil
	}
	_ = p.a.Release(ctx, m.r) // reaping covers a failure
	if closed {
		return store.ErrClosed
	}
	return nil
}

// shut reports, with p.mu held, whether Close or its Allocator's Close ran.
func (p *Pool) shut() bool {
	select {
	case <-p.a.Done():
		p.closed = true
	default:
	}
	return p.closed
}

// Take hands out an idle member. It stays reserved, now in use, until
// Return. Take touches neither the store nor the network; the pool refills
// in the background. With no idle member it allocates one on the spot.
func (p *Pool) Take(ctx context.Context) (store.Reservation, error) {
	// Take is a hot path: it does its work in one frame, and makes the
	// prefix of an error only when there is one.
	p.mu.Lock()
	if p.shut() {
		p.mu.Unlock()
		return store.Reservation{}, opError(fmt.Sprintf("take from pool %q", p.name), store.ErrClosed)
	}
	// Prefer members of the current revision, newest last in idle.
	i := slices.IndexFunc(p.idle, func(m *member) bool { return m.revision == p.rev })
	if i < 0 && len(p.idle) > 0 {
		i = 0
	}
	if i >= 0 {
		m := p.idle[i]
		p.idle = slices.Delete(p.idle, i, i+1)
		p.inUse[m.r.Key] = m
		p.mu.Unlock()
		p.nudge()
		return m.r, nil
	}
	p.mu.Unlock()
	m, err := p.allocate(ctx)
	if err != nil {
		return store.Reservation{}, opError(fmt.Sprintf("take from pool %q", p.name), err)
	}
	p.mu.Lock()
	p.inUse[m.r.Key] = m
	p.mu.Unlock()
	p.nudge()
	return m.r, nil
}

// Return gives a taken member back. One of an older revision, or beyond the
// pool's size, is released instead, waiting at most portalloc.Config.Timeout.
func (p *Pool) Return(r store.Reservation) error {
	p.mu.Lock()
	m, ok := p.inUse[r.Key]
	if !ok {
		p.mu.Unlock()
		return opError(fmt.Sprintf("return to pool %q", p.name), &store.FieldError{Field: "Reservation", Value: r.String(), Want: fmt.Sprintf("a member of pool %q that Take handed out and that is not returned yet", p.name)})
	}
	delete(p.inUse, r.Key)
	keep := !p.shut() && len(p.idle)+p.replacing < p.spec.Size
	if keep {
		p.idle = append(p.idle, m)
	}
	p.mu.Unlock()
	p.nudge()
	if !keep {
		return opError(fmt.Sprintf("return to pool %q", p.name), p.a.Release(context.Background(), r))
	}
	return nil
}

// Update makes spec current and starts a rolling update to it, if it
// changes where members are allocated: Range (or Segment), Addr, Protocol,
// Prefer or Order. A change of Size or MaxUnavailable alone needs none.
// Takes go on working meanwhile. After Close it returns an error wrapping
// store.ErrClosed.
func (p *Pool) Update(spec Spec) error {
	if err := p.setSpec(spec); err != nil { // store.ErrClosed after Close
		return opError(fmt.Sprintf("update pool %q", p.name), err)
	}
	p.nudge()
	return nil
}

// Status returns a snapshot of the pool.
func (p *Pool) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statusLocked()
}

func (p *Pool) statusLocked() Status {
	st := Status{Size: p.spec.Size, Idle: len(p.idle), InUse: len(p.inUse), Revision: p.rev, Replacing: p.replacing}
	for _, m := range slices.Concat(p.idle, slices.Collect(maps.Values(p.inUse))) {
		if m.revision == p.rev {
			st.Updated++
		}
	}
	st.Updating = st.Updated < st.Idle+st.InUse
	return st
}

// Idle returns the idle members' reservations.
func (p *Pool) Idle() []store.Reservation {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]store.Reservation, len(p.idle))
	for i, m := range p.idle {
		out[i] = m.r
	}
	return out
}

// Err returns the last error the background refill or update met, if any.
func (p *Pool) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// OnStep sets a function called after each rolling update step.
func (p *Pool) OnStep(f func(StepInfo)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onStep = f
}

func (p *Pool) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

const (
	retryEvery = 250 * time.Millisecond // after a failure
	// settle is how long the worker lets takes and returns settle before
	// it refills: a member returned within it needs no replacement, so a
	// hot path that takes and returns costs the store nothing.
	settle      = 20 * time.Millisecond
	healthEvery = time.Second // idle members' probes, when no update runs
)

// work refills, checks idle members and steps rolling updates until
// Close or the Allocator's.
func (p *Pool) work() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
		case <-p.a.Done():
			unclaim(p.a, p.name)
		}
		cancel()
	}()
	health := time.NewTicker(healthEvery)
	defer health.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-ctx.Done():
			return
		case <-p.wake:
			select {
			case <-p.stop:
				return
			case <-time.After(settle):
			}
		case <-health.C:
		}
		for p.tend(ctx) != nil && ctx.Err() == nil {
			select {
			case <-p.stop:
				return
			case <-time.After(retryEvery):
			}
		}
	}
}

// tend runs rolling update steps until none is needed, then refills. An
// error is recorded for Err and logged.
func (p *Pool) tend(ctx context.Context) (err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			p.mu.Lock()
			p.lastErr = err
			p.mu.Unlock()
			p.a.Config().Logger.Error(err, "pool could not refill or update; retrying", "pool", p.name, "in", retryEvery.String())
		}
	}()
	for stepped := true; stepped; {
		if stepped, err = p.step(ctx); err != nil {
			return err
		}
	}
	for p.need() > 0 {
		if err := p.refillOne(ctx); err != nil {
			return err
		}
	}
	return nil
}

// step replaces the idle members that need it: every one whose probe
// fails, and up to the budget of those at an older revision. It reports
// whether it replaced any.
func (p *Pool) step(ctx context.Context) (bool, error) {
	// Snapshot the idle members; the probes run without the lock, so a
	// Take never waits on their syscalls.
	p.mu.Lock()
	rev, budget := p.rev, p.budget
	idle := slices.Clone(p.idle)
	updating := slices.ContainsFunc(idle, func(m *member) bool { return m.revision != rev })
	checkHealth := updating || time.Since(p.lastProbe) >= healthEvery
	if checkHealth {
		p.lastProbe = time.Now()
	}
	p.mu.Unlock()

	var unavailable, old []*member
	for _, m := range idle {
		if checkHealth {
			if free, err := portlock.Probe(string(m.r.Protocol), m.r.Addr, m.r.Port); err == nil && !free {
				unavailable = append(unavailable, m)
				continue
			}
		}
		if m.revision != rev {
			old = append(old, m)
		}
	}
	// Oldest first, then by port: a deterministic order.
	slices.SortFunc(old, func(a, b *member) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		return int(a.r.Port) - int(b.r.Port)
	})

	p.mu.Lock()
	// Members taken while the probes ran are in use now: not ours to replace.
	stillIdle := func(m *member) bool { return slices.Contains(p.idle, m) }
	unavailable = slices.DeleteFunc(unavailable, func(m *member) bool { return !stillIdle(m) })
	old = slices.DeleteFunc(old, func(m *member) bool { return !stillIdle(m) })
	old = old[:min(len(old), budget)]
	out := append(unavailable, old...)
	if len(out) == 0 {
		p.mu.Unlock()
		return false, nil
	}
	p.idle = slices.DeleteFunc(p.idle, func(m *member) bool { return slices.Contains(out, m) })
	p.replacing += len(out)
	p.mu.Unlock()

	info := StepInfo{Unavailable: len(unavailable), Budgeted: len(old)}
	var errs []error
	for _, m := range out {
		info.Replaced = append(info.Replaced, m.r.Port)
		// Out of idle, the member is released here or not at all until
		// the process exits: not even Close's cancelling of ctx stops it.
		_ = p.a.Release(ctx, m.r) // for logging only
		nm, err := p.allocate(ctx)
		p.mu.Lock()
		p.replacing--
		if err == nil && !p.shut() {
			p.idle = append(p.idle, nm)
		}
		p.mu.Unlock()
		if err != nil {
			errs = append(errs, err)
		}
	}
	p.mu.Lock()
	info.Status = p.statusLocked()
	onStep := p.onStep
	p.mu.Unlock()
	if onStep != nil {
		onStep(info)
	}
	return true, errors.Join(errs...)
}

// Close stops the background work and releases every idle member. Members
// in use stay reserved until returned (Return then releases them) or until
// the Allocator closes. It takes at most portalloc.Config.Timeout. Close is
// idempotent; after it Take and Update return errors wrapping
// store.ErrClosed, and the pool's name may be used by a new pool.
func (p *Pool) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), p.a.Config().Timeout)
	defer cancel()
	// Wait for the worker and release the idle members until ctx is done: a
	// worker still busy stops on its own, since stopping cancels its waits.
	p.mu.Lock()
	if p.shut() {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	unclaim(p.a, p.name)
	select {
	case <-p.done:
	default:
		close(p.stop)
		select {
		case <-p.done:
		case <-ctx.Done():
		}
	}
	var errs []error
	for _, m := range idle {
		if err := p.a.Release(ctx, m.r); err != nil && !errors.Is(err, store.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	if err := errors.Join(errs...); err != nil {
		return opError("", fmt.Errorf("close pool %q: %w", p.name, err))
	}
	return nil
}

// opError wraps err in a *portalloc.OpError for op, the one place the
// package's calls add the prefix. nil stays nil.
func opError(op string, err error) error {
	if err == nil {
		return nil
	}
	// An error of the Allocator's has its prefix already: one is enough.
	if oe, ok := err.(*portalloc.OpError); ok { //nolint:errorlint // only an OpError at the top, not one wrapped deeper
		err = oe.Err
	}
	return &portalloc.OpError{Op: op, Err: err}
}
