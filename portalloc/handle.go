package portalloc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// A process opens one handle per store (per SQLite file by its canonical
// path, per fleet's database, per store given to NewWithStore), shared by
// every Allocator on it as sql.Open shares a *sql.DB. The handle keeps the
// process's one record of what it holds there (holding): the row, the
// kernel lock taken with it in the store's write, and which Allocators
// hold it. On a lost file or a failover it puts the rows of the record
// back (reconcile), the same code for every store. handles are the
// process's open handles, by name.
var handles = struct {
	mu sync.Mutex // guards m and every handle's refs
	m  map[string]*handle
}{m: map[string]*handle{}}

// handle is one store of the process, and what the process holds in it.
type handle struct {
	name string // in handles
	refs int    // the Allocators that use it; guarded by handles.mu
	what string // the store for people: a path, a DSN without password
	// open opens the store again after a loss or a while unusable; nil when
	// it cannot be (a fleet's, whose losses are of rows, or NewWithStore's).
	open func(ctx context.Context) (store.Store, error)
	mru  *mru.File // the fallback of a state directory; nil otherwise
	log  logr.Logger
	warn logr.Logger
	self store.Owner

	// turn is taken by every call that writes rows or the record, and by
	// the repair: one at a time, so that the record and the rows change
	// together. It is a channel so that a wait ends with its context.
	turn chan struct{}
	// s is the store, nil while it cannot be used (then down says why).
	// Written under turn; read through cur by calls that only read.
	s   store.Store
	cur atomic.Pointer[store.Store]

	down  error                 // why the store cannot be used now; guarded by turn
	downs atomic.Pointer[error] // down, for readers that do not take turn
	retry time.Time             // when to try to open it again; guarded by turn
	again bool                  // reconcile at the next check; guarded by turn

	mu   sync.Mutex // guards held, for readers that do not take turn
	held map[store.Key]*holding

	stop    chan struct{}      // closed when the last Allocator lets go
	halt    context.CancelFunc // cancels the watcher's calls then
	haltCtx context.Context
	bg      sync.WaitGroup // the watch, and stores closing aside

	restored, lost, rereleased atomic.Int64

	logs logFan // the sharing Allocators' Loggers, which log and warn reach
}

// selfKept holds the locks of reservations handed to this very process
// (Transfer to its own pid) until it exits: past every Allocator and
// handle, and out of reach of a garbage collector that would close them.
var selfKept struct {
	mu    sync.Mutex
	locks []*portlock.Lock
}

// holding is what the process holds of one key, or released lately.
type holding struct {
	row  store.Reservation // the reservation, Owner this process
	lock *portlock.Lock    // nil once released
	mru  bool              // handed out by the MRU file: no row
	// by counts each Allocator's holds (its calls, its sets', pools' and
	// helpers'); the row goes when the last is dropped.
	by map[*Allocator]int
	// released is when the holding was released (by is empty then), kept
	// for redoWindow so that a reconcile deletes the row again where a
	// failover brought it back; failed says the delete has not succeeded.
	released time.Time
	failed   bool
}

func (e *holding) holds() int {
	n := 0
	for _, c := range e.by {
		n += c
	}
	return n
}

// redoWindow is how long a release is kept in the record to be done
// again; maxReleased bounds how many are kept.
const (
	redoWindow  = 10 * time.Minute
	maxReleased = 4096
)

// share returns the handle named name, opening it with open when the
// process has none; down, when the store cannot be opened and mayFail says
// the caller can serve without it (the fallback). Let go with unref.
func share(ctx context.Context, name, what string, open func(context.Context) (store.Store, error), reopenable bool, m *mru.File, who any, log, warn logr.Logger, mayFail func(error) bool) (*handle, error) {
	// join takes a reference of h, open already, whose own MRU file serves,
	// unless h is down and mayFail refuses. The caller holds handles.mu.
	join := func(h *handle, mayFail func(error) bool) (*handle, error) {
		defer handles.mu.Unlock()
		if m != nil {
			_ = m.Close()
		}
		if down := h.downNow(); h.store() == nil && down != nil && !mayFail(down) {
			return nil, down
		}
		h.refs++
		h.logs.add(who, log, warn)
		return h, nil
	}
	handles.mu.Lock()
	if h := handles.m[name]; h != nil {
		return join(h, mayFail)
	}
	handles.mu.Unlock()

	self, err := store.Self()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	h := &handle{name: name, refs: 1, what: what, mru: m, self: self,
		turn: make(chan struct{}, 1), held: map[store.Key]*holding{}, stop: make(chan struct{})}
	h.log, h.warn = h.logs.loggers()
	h.logs.add(who, log, warn)
	h.haltCtx, h.halt = context.WithCancel(context.Background())
	if reopenable {
		h.open = open
	}
	s, err := open(ctx)
	if err != nil {
		if !mayFail(err) {
			return nil, err
		}
		s, h.retry = nil, time.Now().Add(storeRetryInterval)
	}
	h.set(s, err)

	handles.mu.Lock()
	if other := handles.m[name]; other != nil {
		// Another Allocator opened it meanwhile: use that one.
		if s != nil {
			defer func() { _ = s.Close() }()
		}
		return join(other, func(error) bool { return true })
	}
	handles.m[name] = h
	handles.mu.Unlock()
	h.bg.Add(1)
	go h.watch() //nolint:contextcheck // it outlives share's context; the last unref stops it
	return h, nil
}

// unref lets go of the handle for who, an Allocator; the last closes the
// store.
func (h *handle) unref(ctx context.Context, who any) error {
	handles.mu.Lock()
	h.refs--
	last := h.refs == 0
	if !last {
		h.logs.remove(who) // the last one's stay, for what closing logs
	} else {
		delete(handles.m, h.name)
	}
	handles.mu.Unlock()
	if !last {
		return nil
	}
	close(h.stop)
	h.halt()
	h.bg.Wait()
	var errs []error
	// Every Allocator is closed: a call still in flight ends within its
	// own timeout; Close waits for it at most until ctx is done, and
	// closes the store under it then, which fails it.
	if h.lockTurn(ctx) == nil {
		defer h.unlockTurn()
	}
	for _, e := range h.held {
		if e.lock != nil {
			errs = append(errs, e.lock.Close())
		}
	}
	if h.s != nil {
		errs = append(errs, h.s.Close())
	}
	if h.mru != nil {
		errs = append(errs, h.mru.Close())
	}
	return errors.Join(errs...)
}

// lockTurn waits for the handle's turn until ctx is done.
func (h *handle) lockTurn(ctx context.Context) error {
	select {
	case h.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *handle) unlockTurn() { <-h.turn }

// set records the store (nil while down) and why it cannot be used (nil:
// it can). The caller holds turn.
func (h *handle) set(s store.Store, down error) {
	h.s, h.down = s, down
	setPtr(&h.cur, s)
	setPtr(&h.downs, down)
}

// downNow and store read down and s without turn, for calls that only read.
func (h *handle) downNow() error     { return load(&h.downs) }
func (h *handle) store() store.Store { return load(&h.cur) }

// setPtr stores v in p; nil for the zero v.
func setPtr[T comparable](p *atomic.Pointer[T], v T) {
	var zero T
	if v == zero {
		p.Store(nil)
		return
	}
	p.Store(&v)
}

// load returns what p points to, or the zero T.
func load[T any](p *atomic.Pointer[T]) (v T) {
	if q := p.Load(); q != nil {
		v = *q
	}
	return v
}

// usable reports whether the store can be used now, opening it again when
// it was down and its retry is due. The caller holds turn.
func (h *handle) usable(ctx context.Context) bool {
	if h.s != nil {
		return true
	}
	if h.open == nil || time.Now().Before(h.retry) {
		return false
	}
	h.retry = time.Now().Add(storeRetryInterval)
	s, err := h.open(ctx)
	if err != nil {
		if !transient(err) {
			h.set(nil, err) // a busy store says nothing new of the cause
		}
		h.log.V(1).Info("the state store is still unavailable", "store", h.what, "error", err.Error(), "retryIn", storeRetryInterval.String())
		return false
	}
	h.set(s, nil)
	h.again = true // put back what the process holds
	h.warn.Info("state store usable again; allocating from it", "store", h.what)
	return true
}

// fail takes the store out of service for err, a failure another call
// would meet too (a damaged file, a newer schema), so that every Allocator
// serves from its fallback until the retry; one that cannot be opened again
// stays. The caller holds turn.
func (h *handle) fail(err error) {
	if h.open == nil || h.s == nil {
		return
	}
	old := h.s
	h.set(nil, err)
	h.retry = time.Now().Add(storeRetryInterval)
	h.closeAside(old)
	h.warn.Error(err, "state store unavailable; allocating from the MRU file instead, where every port is still locked (no port a live berth holder keeps is handed out), but recorded nowhere a listing shows; retrying the store periodically",
		"store", h.what, "mru", h.mru.Path(), "retryEvery", storeRetryInterval.String())
}

// closeAside closes a store the handle no longer uses, off the caller's
// path: a call that took it before may still run on it.
func (h *handle) closeAside(s store.Store) {
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		_ = s.Close()
	}()
}

// do runs op on the store, again when the store was lost under it and
// repaired (at most maxRepairs times). The caller holds turn.
func (h *handle) do(ctx context.Context, op func(store.Store) error) error {
	for try := 0; ; try++ {
		if !h.usable(ctx) {
			return h.downErr()
		}
		s := h.s
		err := op(s)
		if err == nil || !errors.Is(err, store.ErrLost) || try == maxRepairs {
			return err
		}
		if rerr := h.repair(ctx, s, err); rerr != nil {
			return rerr
		}
	}
}

// maxRepairs is how many times one call goes on with a store opened again
// after a loss: a store lost again each time (a cleaner that keeps
// deleting) fails the call after that.
const maxRepairs = 3

// read runs op, which changes no record (a listing, a reap, a renewal), as
// do does, taking turn.
func (h *handle) read(ctx context.Context, op func(store.Store) error) error {
	if err := h.lockTurn(ctx); err != nil {
		return err
	}
	defer h.unlockTurn()
	return h.do(ctx, op)
}

func (h *handle) downErr() error {
	if h.down != nil {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, h.down)
	}
	return fmt.Errorf("%w: the store %s is closed", store.ErrUnavailable, h.what)
}

// repair deals with lost, a store that reported why (store.ErrLost): a
// file's store is opened again at the same place (new and empty if need
// be); either way reconcile puts the record back. The caller holds turn.
func (h *handle) repair(ctx context.Context, lost store.Store, why error) error {
	if h.s != lost {
		return nil // repaired meanwhile
	}
	if h.open != nil {
		if errors.Is(why, store.ErrTransient) {
			// Left read-only by a shortage, a state SQLite gives every new
			// connection of the process to the file while one is open.
			h.set(nil, why)
			h.retry = time.Time{} // the next call opens it if this cannot
			_ = lost.Close()
		}
		s, err := h.open(ctx)
		for try := 1; err != nil && try < 3 && ctx.Err() == nil &&
			!errors.Is(err, store.ErrDamaged) && !errors.Is(err, store.ErrUnsafe) && !errors.Is(err, store.ErrSchemaTooNew); try++ {
			// Whatever lost the file may still be at work (a cleaner
			// removing the directory as it is made again): try again,
			// unless trying again at once cannot mend it.
			time.Sleep(time.Duration(try) * 20 * time.Millisecond)
			s, err = h.open(ctx)
		}
		if err != nil {
			msg := "the state store's file was lost and cannot be opened again; this process's reservations are kept by their locks, and recorded again once it can"
			if transient(err) {
				// A passing shortage: the next call tries again.
				h.log.V(1).Info(msg, "store", h.what, "lost", why.Error(), "error", err.Error())
			} else {
				h.warn.Error(err, msg, "store", h.what, "lost", why.Error())
			}
			h.again = true
			return errors.Join(fmt.Errorf("%w; opening it again: %w", why, err), ctx.Err()) // a call out of time says so
		}
		h.set(s, nil)
		h.closeAside(lost)
	}
	put, failed := h.reconcile(ctx, h.s)
	h.warn.Info("the store lost this process's reservations (its file deleted, replaced or truncated, or a failover); put them back",
		"store", h.what, "cause", why.Error(), "restored", put, "notRestored", failed)
	return nil
}

// reconcile puts back in s, without a probe (the lock is this process's,
// which may be listening on the port), every row held that is missing, and
// deletes again every row released that is there. A row another owner took
// meanwhile is logged naming both and counted in Stats.Lost (its lock still
// keeps the port from every berth). It returns how many it put back and
// could not. The caller holds turn.
func (h *handle) reconcile(ctx context.Context, s store.Store) (put, failed int) {
	h.again = false
	rows, err := s.List(ctx, store.Filter{OwnerPID: h.self.PID})
	if err != nil {
		h.log.V(1).Info("could not compare this process's reservations with the store; the next check tries again", "store", h.what, "error", err.Error())
		h.again = true
		return 0, 0
	}
	have := make(map[store.Key]bool, len(rows))
	for _, r := range rows {
		if r.Owner.Same(h.self) {
			have[r.Key] = true
		}
	}
	h.mu.Lock()
	record := slices.Collect(maps.Values(h.held))
	h.mu.Unlock()
	now := time.Now()
	for _, e := range record {
		k := e.row.Key
		switch {
		case e.mru:
		case e.lock != nil && !have[k]:
			// Restore: a store that pauses grants after a change of its
			// server (store.ErrGrace) takes back what its holders held.
			_, err := s.Reserve(ctx, store.Request{Key: k, Label: e.row.Label, Kind: e.row.Kind, Restore: true})
			var ce *store.ConflictError
			switch {
			case err == nil:
				put++
			case errors.As(err, &ce):
				failed++
				h.warn.Error(err, "a reservation of this process could not be put back in the store: another owner has a row for the port (its lock keeps the port from every berth all the same)",
					"reservation", k.String(), "holder", ce.Holder.Owner.String())
			default:
				h.again = true
				h.log.V(1).Info("a reservation could not be put back yet; trying again", "reservation", k.String(), "error", err.Error())
			}
		case e.lock == nil && have[k]:
			switch err := s.Release(ctx, k, store.Owner{}); {
			case err == nil:
				h.rereleased.Add(1)
				h.warn.Info("released again a reservation of this process that was back in the store (a release lost in a failover, or one that failed)",
					"reservation", k.String(), "releasedAt", e.released.UTC().Format(time.RFC3339Nano))
				h.forget(k, e)
			case errors.Is(err, store.ErrNotFound):
				h.forget(k, e)
			default:
				h.again = true
			}
		case e.lock == nil && (!e.failed || !have[k]) && now.Sub(e.released) > redoWindow:
			h.forget(k, e)
		case e.lock == nil && e.failed && !have[k]:
			h.mu.Lock()
			e.failed = false // gone from the store: as good as released
			h.mu.Unlock()
		}
	}
	h.restored.Add(int64(put))
	h.lost.Add(int64(failed))
	return put, failed
}

// forget drops e, a released holding of k, unless k was taken again.
func (h *handle) forget(k store.Key, e *holding) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held[k] == e {
		delete(h.held, k)
	}
}

// checkInterval is how often a handle that holds something asks its store
// whether it lost rows (store.Store.Check); tests shorten it.
var checkInterval = time.Second

// watch checks the store every checkInterval while the record is not
// empty, repairs what was lost, and retries a store that is down.
func (h *handle) watch() {
	defer h.bg.Done()
	t := time.NewTicker(checkInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		h.mu.Lock()
		busy := len(h.held) > 0
		h.mu.Unlock()
		if !busy {
			continue
		}
		select {
		case h.turn <- struct{}{}: // a call that holds it checks by itself
		default:
			continue
		}
		ctx, cancel := context.WithTimeout(h.haltCtx, 10*checkInterval)
		if h.usable(ctx) {
			s := h.s
			if err := s.Check(ctx); errors.Is(err, store.ErrLost) {
				_ = h.repair(ctx, s, err) // logged; the next check tries again
			} else if err == nil && (h.again || h.releasesFailed()) {
				h.reconcile(ctx, s)
			}
		}
		cancel()
		h.unlockTurn()
	}
}

// releasesFailed reports whether a release has not reached the store yet.
func (h *handle) releasesFailed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.held {
		if e.lock == nil && e.failed {
			return true
		}
	}
	return false
}

// heldBy returns the reservations a holds, each once.
func (h *handle) heldBy(a *Allocator) []store.Reservation {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []store.Reservation
	for _, e := range h.held {
		if e.by[a] > 0 {
			out = append(out, e.row)
		}
	}
	return out
}

// A grant takes, for the key a store's write is about to record, the key's
// kernel lock and then a bind-probe (or a bind, for Listen), inside that
// write: no other berth process, whatever its store, can be granted a
// conflicting key while the lock is held, and none can choose the key
// between the probe and the row. The locks a grant takes are kept by the
// locker until the grant is settled: those of the rows made go into the
// record (or to the keeper of a named holder), the others are let go.
type locker struct {
	// check bind-probes a key whose lock is held: an error wrapping
	// store.ErrHeld when the port is bound outside berth.
	check func(store.Key) error
	taken map[store.Key]*portlock.Lock
	log   logr.Logger
}

// probe is the store's probe: the lock, then check.
func (l *locker) probe(k store.Key) error {
	lk, err := portlock.Acquire(string(k.Protocol), k.Addr, k.Port)
	if err != nil {
		return lockErr(k, err)
	}
	if err := l.check(k); err != nil {
		_ = lk.Close()
		var ce *store.ConflictError
		if errors.As(err, &ce) && ce.Bound {
			l.log.V(1).Info("port bound outside berth", "key", k.String())
		}
		return err
	}
	l.taken[k] = lk
	return nil
}

// keep returns the locks of keys and lets go of every other.
func (l *locker) keep(keys []store.Key) []*portlock.Lock {
	out := make([]*portlock.Lock, len(keys))
	for i, k := range keys {
		out[i] = l.taken[k]
		delete(l.taken, k)
	}
	l.closeAll()
	return out
}

func (l *locker) closeAll() {
	for k, lk := range l.taken {
		_ = lk.Close()
		delete(l.taken, k)
	}
}

// lockErr puts a lock's refusal into a *store.ConflictError whose holder
// has no owner; any other error (out of descriptors, say) is returned as is.
func lockErr(k store.Key, err error) error {
	var he *portlock.HeldError
	if !errors.As(err, &he) {
		return err
	}
	in := k
	switch {
	case he.In.IsValid():
		in.Addr = he.In
	case he.Slots:
	default:
		in.Addr = k.Addr // a specific address of the port, which the lock does not tell
	}
	return &store.ConflictError{Key: k, Holder: store.Reservation{Key: in}}
}

// probeCheck is the check of an allocation: a bind-probe.
func probeCheck(k store.Key) error {
	free, err := portlock.Probe(string(k.Protocol), k.Addr, k.Port)
	if err != nil {
		return err
	}
	if !free {
		return &store.ConflictError{Key: k, Bound: true}
	}
	return nil
}

// fromMRU reports whether a's grant comes from the MRU file: in ModeMRU,
// and in the fallback mode while the store is down. The caller holds turn.
func (h *handle) fromMRU(ctx context.Context, a *Allocator) bool {
	return h.mru != nil && (a.cfg.Mode == ModeMRU || a.cfg.Mode == ModeStateStoreWithFallback && !h.usable(ctx))
}

// fallsBack reports whether err, a failure of the store and not of the
// request, makes a's grant fall back to the MRU file, taking the store out
// of service. Waiting (a busy store, a shortage, a timeout) never does: the
// MRU file would meet the same, and it passes. The caller holds turn.
func (h *handle) fallsBack(a *Allocator, err error) bool {
	if h.mru == nil || a.cfg.Mode != ModeStateStoreWithFallback || transient(err) || errors.Is(err, store.ErrUnsafe) ||
		!errors.Is(err, store.ErrStorage) && !errors.Is(err, store.ErrDamaged) && !errors.Is(err, store.ErrSchemaTooNew) && !errors.Is(err, store.ErrUnavailable) {
		return false
	}
	if h.s != nil {
		h.fail(err)
		a.ctr.fallbacks.Add(1)
	}
	return true
}

// grant runs a grant with turn, for a (own zero) or the named holder own
// under a lease of ttl. In the store, inStore makes the rows with the probe
// it is given (the lock, then check); from the MRU file, inFile takes its
// one key's lock with l. key is a Reserve's (zero for a scan): one the
// process holds already gets one more hold of a.
func (h *handle) grant(ctx context.Context, a *Allocator, own store.Owner, ttl time.Duration, key store.Key, check func(store.Key) error,
	inStore func(store.Store, func(store.Key) error) ([]store.Reservation, error),
	inFile func(*locker) (store.Reservation, error),
) ([]store.Reservation, error) {
	if err := h.lockTurn(ctx); err != nil {
		return nil, err
	}
	defer h.unlockTurn()
	if a.closed.Load() {
		return nil, store.ErrClosed
	}
	if own.IsZero() && key.Port != 0 {
		h.mu.Lock()
		e := h.held[key]
		if e != nil && e.released.IsZero() {
			e.by[a]++
			h.mu.Unlock()
			return []store.Reservation{e.row}, nil
		}
		h.mu.Unlock()
	}
	l := &locker{check: check, taken: map[store.Key]*portlock.Lock{}, log: h.log}
	if !h.fromMRU(ctx, a) {
		var rows []store.Reservation
		err := h.do(ctx, func(s store.Store) (err error) {
			l.closeAll()
			rows, err = inStore(s, l.probe)
			return err
		})
		if err == nil {
			keys := make([]store.Key, len(rows))
			for i, r := range rows {
				keys[i] = r.Key
			}
			return h.settle(ctx, a, own, ttl, rows, l.keep(keys), key.Port == 0)
		}
		l.closeAll()
		if !h.fallsBack(a, err) {
			return nil, h.conflict(err)
		}
	}
	if !own.IsZero() {
		return nil, h.noLease()
	}
	row, err := inFile(l)
	if err != nil {
		l.closeAll()
		return nil, err
	}
	row.Owner, row.Created = h.self, time.Now()
	lk := l.keep([]store.Key{row.Key})[0]
	if a.closed.Load() {
		_ = lk.Close()
		return nil, store.ErrClosed
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held[row.Key] = &holding{row: row, lock: lk, mru: true, by: map[*Allocator]int{a: 1}}
	return []store.Reservation{row}, nil
}

// reserve reserves req.Key for a (req.Owner zero) or for a named holder.
// check bind-probes the key once its lock is held.
func (h *handle) reserve(ctx context.Context, a *Allocator, req store.Request, check func(store.Key) error) (store.Reservation, error) {
	rows, err := h.grant(ctx, a, req.Owner, req.TTL, req.Key, check, func(s store.Store, probe func(store.Key) error) ([]store.Reservation, error) {
		req.Probe = probe
		row, err := s.Reserve(ctx, req)
		return []store.Reservation{row}, err
	}, func(l *locker) (store.Reservation, error) {
		// The MRU file: the lock and the probe, and a line of the file.
		if err := l.probe(req.Key); err != nil {
			return store.Reservation{}, h.conflict(err)
		}
		if err := h.mru.Record(ctx, string(req.Protocol), req.Port); err != nil {
			h.log.Error(err, "could not record a reserved port in the MRU file", "port", req.Port)
		}
		return store.Reservation{Key: req.Key, Label: req.Label, Kind: store.Static}, nil
	})
	if err != nil {
		return store.Reservation{}, err
	}
	return rows[0], nil
}

// scan reserves the first free candidate of req for a (req.Owner zero) or
// for a named holder; n > 0 reserves a block of n consecutive ports.
func (h *handle) scan(ctx context.Context, a *Allocator, req store.ScanRequest, n int, check func(store.Key) error) ([]store.Reservation, error) {
	return h.grant(ctx, a, req.Owner, req.TTL, store.Key{}, check, func(s store.Store, probe func(store.Key) error) ([]store.Reservation, error) {
		req.Probe = probe
		if n > 0 {
			return s.ScanBlock(ctx, req, n)
		}
		r, err := s.Scan(ctx, req)
		return []store.Reservation{r}, err
	}, func(l *locker) (store.Reservation, error) {
		if n > 0 {
			return store.Reservation{}, fmt.Errorf("%w (%w), and the MRU file hands out single ports only", store.ErrUnavailable, h.cause(a))
		}
		key := store.Key{Protocol: req.Protocol, Addr: req.Addr}
		port, err := h.mru.Allocate(ctx, mru.Request{Protocol: string(req.Protocol), Addr: req.Addr, Next: req.Next, Probe: func(p uint16) (bool, error) {
			k := key
			k.Port = p
			err := l.probe(k)
			if errors.Is(err, store.ErrHeld) {
				return false, nil
			}
			return err == nil, err
		}})
		if errors.Is(err, mru.ErrExhausted) {
			err = fmt.Errorf("%w: %w", store.ErrExhausted, err)
		}
		key.Port = port
		return store.Reservation{Key: key, Label: req.Label, Kind: store.Dynamic}, err
	})
}

// cause says why a's grants come from the MRU file.
func (h *handle) cause(a *Allocator) error {
	if a.cfg.Mode == ModeMRU || h.down == nil {
		return errors.New("Config.Mode is mru")
	}
	return h.down
}

// noLease refuses a named holder's grant while the store is down.
func (h *handle) noLease() error {
	return fmt.Errorf("%w: a named holder's reservation needs the state store (%w)", store.ErrUnavailable, h.downErr())
}

// settle records rows, just made by a grant of a with locks, each held once
// by a, or hands the locks to the keeper of the named holder own for ttl;
// if a closed meanwhile, the rows are released again (store.ErrClosed).
// scanned says the rows are new; a Reserve may return a row this process
// had, whose lock it then takes without a probe.
func (h *handle) settle(ctx context.Context, a *Allocator, own store.Owner, ttl time.Duration, rows []store.Reservation, locks []*portlock.Lock, scanned bool) ([]store.Reservation, error) {
	if own.Holder != "" {
		live := slices.DeleteFunc(slices.Clone(locks), func(lk *portlock.Lock) bool { return lk == nil })
		var err error
		if len(live) > 0 {
			_, err = h.hold(portlock.HolderKeeper(own.Holder), ttl, live...)
		}
		for _, lk := range live {
			_ = lk.Close()
		}
		if err != nil {
			// No keeper holds the locks: the grant is undone rather than
			// left to a row that a lost store would take with it.
			for _, r := range rows {
				_ = h.do(context.WithoutCancel(ctx), func(s store.Store) error { return s.Release(ctx, r.Key, own) })
			}
			return nil, err
		}
		return rows, nil
	}
	if a.closed.Load() {
		for i, r := range rows {
			_ = h.do(context.WithoutCancel(ctx), func(s store.Store) error { return s.Release(ctx, r.Key, store.Owner{}) })
			if locks[i] != nil {
				_ = locks[i].Close()
			}
		}
		return nil, store.ErrClosed
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, r := range rows {
		lk := locks[i]
		if lk == nil && !scanned {
			// A row of this process's that the record lacked: its lock,
			// without a probe (the process may be listening on the port).
			// Held elsewhere (by the keeper of this very process), it
			// stays there.
			lk, _ = portlock.Acquire(string(r.Protocol), r.Addr, r.Port)
		}
		h.held[r.Key] = &holding{row: r, lock: lk, by: map[*Allocator]int{a: 1}}
	}
	return rows, nil
}

// hold hands copies of locks to k; this process's own stay open. Where no
// keeper can run (ErrNoKeeper: not Linux) the row alone keeps the
// reservation, logged at V(1), and kept is false. A keeper that cannot take
// them is an error wrapping store.ErrTransient for a passing shortage,
// store.ErrUnavailable otherwise.
func (h *handle) hold(k portlock.Keeper, ttl time.Duration, locks ...*portlock.Lock) (kept bool, err error) {
	switch err := k.Hold(ttl, locks...); {
	case err == nil:
		return true, nil
	case errors.Is(err, portlock.ErrNoKeeper):
		h.log.V(1).Info("no keeper on this system: the reservation is kept by its row in the store alone", "keeper", k.String())
		return false, nil
	case transient(err):
		return false, fmt.Errorf("%w: %s could not take the reservation's lock: %w", store.ErrTransient, k, err)
	default:
		return false, fmt.Errorf("%w: %s could not take the reservation's lock: %w", store.ErrUnavailable, k, err)
	}
}

// conflict completes a *store.ConflictError whose holder the store does not
// know (a lock without a row) with the process's own reservation, if in the
// record. Any other error is returned as it is.
func (h *handle) conflict(err error) error {
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Holder.Owner.IsZero() || ce.Bound {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, e := range h.held {
		if e.released.IsZero() && k.Conflicts(ce.Key) {
			ce.Holder, ce.Self = e.row, true
			return err
		}
	}
	return err
}

// whoLocks fills in the processes that hold the lock in ce's way: a look
// at every process of the host, for a conflict reported to people.
func whoLocks(ce *store.ConflictError) {
	if ce.Bound || ce.Self || !ce.Holder.Owner.IsZero() {
		return
	}
	held, err := portlock.List()
	if err != nil {
		return
	}
	for _, l := range held {
		if l.Network != string(ce.Key.Protocol) || l.Port != ce.Key.Port {
			continue
		}
		if !l.Addr.IsValid() || ce.Key.Addr.IsUnspecified() || l.Addr == ce.Key.Addr {
			ce.PIDs = append(ce.PIDs, l.PIDs...)
		}
	}
	slices.Sort(ce.PIDs)
	ce.PIDs = slices.Compact(ce.PIDs)
}
