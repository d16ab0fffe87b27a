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

// A process opens one handle per store, as sql.Open gives one *sql.DB per
// data source: per SQLite file (its canonical path), per fleet's database,
// per store given to NewWithStore. Every Allocator of the process on that
// store shares it, and through them every set, pool and helper. The handle
// keeps the process's one record of what it holds there (holding): the
// row, the kernel lock that guards it, and which Allocators hold it. The
// locks are taken with the rows, in the store's write, and dropped with
// them; on a lost file or a failover the handle opens the store again (a
// file) and puts the rows of the record back (reconcile), the same code
// for every store.

// handles are the process's open handles, by name.
var handles = struct {
	mu sync.Mutex // guards m and every handle's refs
	m  map[string]*handle
}{m: map[string]*handle{}}

// handle is one store of the process, and what the process holds in it.
type handle struct {
	name string // in handles
	refs int    // the Allocators that use it; guarded by handles.mu
	what string // the store for people: a path, a DSN without password
	// open opens the store again after its file was lost, or after it
	// could not be used for a while; nil for a store that cannot be
	// opened again (a fleet's, whose losses are of rows, and one given to
	// NewWithStore).
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

	stop chan struct{} // closed when the last Allocator lets go
	// halt cancels the watcher's calls when the last Allocator lets go.
	halt    context.CancelFunc
	haltCtx context.Context
	bg      sync.WaitGroup // the watch, and stores closing aside

	restored, lost, rereleased atomic.Int64

	// logs are the Loggers of the Allocators that share the handle, which
	// its log and warn reach.
	logs logFan
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
	// by counts the holds of each Allocator of the process: its own
	// Allocate and Reserve calls, those of its sets, pools and helpers. The
	// row goes when the last is dropped.
	by map[*Allocator]int
	// released is when the holding was released (by is empty then): the
	// row is kept in the record for redoWindow, so that a reconcile deletes
	// it again where a failover brought it back; failed says the store's
	// delete has not succeeded yet.
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
// process has none. A store that cannot be opened still gives a handle,
// down for that reason, when mayFail says the caller can serve without it
// (the fallback); otherwise the error. The caller lets go with unref.
func share(ctx context.Context, name, what string, open func(context.Context) (store.Store, error), reopenable bool, m *mru.File, who any, log, warn logr.Logger, mayFail func(error) bool) (*handle, error) {
	handles.mu.Lock()
	if h := handles.m[name]; h != nil {
		if down := h.downNow(); h.store() == nil && down != nil && !mayFail(down) {
			// Down for the others, and this caller may not serve without it.
			handles.mu.Unlock()
			if m != nil {
				_ = m.Close()
			}
			return nil, down
		}
		h.refs++
		h.logs.add(who, log, warn)
		handles.mu.Unlock()
		if m != nil {
			_ = m.Close() // the handle's own serves
		}
		return h, nil
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
		h.setDown(err)
		h.retry = time.Now().Add(storeRetry())
	} else {
		h.setStore(s)
	}

	handles.mu.Lock()
	if other := handles.m[name]; other != nil {
		// Another Allocator opened it meanwhile: use that one.
		other.refs++
		other.logs.add(who, log, warn)
		handles.mu.Unlock()
		if s != nil {
			_ = s.Close()
		}
		if m != nil {
			_ = m.Close()
		}
		return other, nil
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
	if h.refs > 0 {
		h.logs.remove(who) // the last one's stay, for what closing logs
	}
	last := h.refs == 0
	if last {
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

// setDown records why the store cannot be used (nil: it can). The caller
// holds turn.
func (h *handle) setDown(err error) {
	h.down = err
	if err == nil {
		h.downs.Store(nil)
		return
	}
	h.downs.Store(&err)
}

// downNow returns why the store cannot be used, without turn.
func (h *handle) downNow() error {
	if p := h.downs.Load(); p != nil {
		return *p
	}
	return nil
}

func (h *handle) setStore(s store.Store) {
	h.s = s
	if s == nil {
		h.cur.Store(nil)
		return
	}
	h.cur.Store(&s)
}

// store returns the store for a call that only reads, or nil while it is
// down.
func (h *handle) store() store.Store {
	if p := h.cur.Load(); p != nil {
		return *p
	}
	return nil
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
	h.retry = time.Now().Add(storeRetry())
	s, err := h.open(ctx)
	if err != nil {
		if !transient(err) {
			h.setDown(err) // a busy store says nothing new of the cause
		}
		h.log.V(1).Info("the state store is still unavailable", "store", h.what, "error", err.Error(), "retryIn", storeRetry().String())
		return false
	}
	h.setStore(s)
	h.setDown(nil)
	h.again = true // put back what the process holds
	h.warn.Info("state store usable again; allocating from it", "store", h.what)
	return true
}

// fail takes the store out of service for err, a failure that another
// call would meet too (a damaged file, a newer schema), so that every
// Allocator of the process serves from its fallback until the retry. The
// caller holds turn. A store that cannot be opened again stays.
func (h *handle) fail(err error) {
	if h.open == nil || h.s == nil {
		return
	}
	old := h.s
	h.setStore(nil)
	h.setDown(err)
	h.retry = time.Now().Add(storeRetry())
	h.closeAside(old)
	h.warn.Error(err, "state store unavailable; allocating from the MRU file instead, where every port is still locked (no port a live berth holder keeps is handed out), but recorded nowhere a listing shows; retrying the store periodically",
		"store", h.what, "mru", h.mru.Path(), "retryEvery", storeRetry().String())
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

// do runs op on the store, once more when the store was lost under it and
// the handle opened it again (at most maxRepairs times). The caller holds
// turn. A store that is down is an error wrapping store.ErrUnavailable.
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

// read runs op, a call that changes no record (a listing, a reap, a
// lease's renewal), on the store with the handle's turn, as do does.
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

// repair deals with lost, a store that reported why (an error wrapping
// store.ErrLost): a store of a file is opened again at the same place (a
// new, empty one if need be); either way the rows of the record are put
// back and those released are deleted again (reconcile). The caller
// holds turn.
func (h *handle) repair(ctx context.Context, lost store.Store, why error) error {
	if h.s != lost {
		return nil // repaired meanwhile
	}
	if h.open != nil {
		s, err := h.open(ctx)
		for try := 1; err != nil && try < 3 && ctx.Err() == nil && !lasting(err); try++ {
			// Whatever lost the file may still be at work (a cleaner
			// removing the directory as it is made again): try again.
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
			return fmt.Errorf("%w; opening it again: %w", why, err)
		}
		h.setStore(s)
		h.closeAside(lost)
	}
	put, failed, _ := h.reconcile(ctx, h.s)
	h.warn.Info("the store lost this process's reservations (its file deleted, replaced or truncated, or a failover); put them back",
		"store", h.what, "cause", why.Error(), "restored", put, "notRestored", failed)
	return nil
}

// lasting reports whether err of opening a store is one that trying again
// at once cannot mend.
func lasting(err error) bool {
	return errors.Is(err, store.ErrDamaged) || errors.Is(err, store.ErrUnsafe) || errors.Is(err, store.ErrSchemaTooNew)
}

// reconcile compares the record with the rows of this process in s: it
// puts back, without a probe (the lock is this process's, and the process
// may be listening on the port), every row held that is missing, and
// deletes again every row released that is there. A row another owner
// took meanwhile cannot be put back: that is logged naming both, and
// counted in Stats.Lost; its lock still keeps the port from every berth.
// It returns how many it put back and could not, and whether anything is
// left to do at the next check. The caller holds turn.
func (h *handle) reconcile(ctx context.Context, s store.Store) (put, failed int, pending bool) {
	h.again = false
	rows, err := s.List(ctx, store.Filter{OwnerPID: h.self.PID})
	if err != nil {
		h.log.V(1).Info("could not compare this process's reservations with the store; the next check tries again", "store", h.what, "error", err.Error())
		h.again = true
		return 0, 0, true
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
				h.again, pending = true, true
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
				h.again, pending = true, true
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
	return put, failed, pending
}

// forget drops e, a released holding of k, from the record unless k was
// taken again meanwhile.
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

// watch checks the store every checkInterval while the process holds or
// has released something in it, repairs what was lost, and tries a store
// that is down again. The last unref stops it.
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

// releasesFailed reports whether a release of the process has not reached
// the store yet.
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
