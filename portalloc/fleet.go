package portalloc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// fleetWant says what Config.StoreDSN must be for the fleet-wide calls.
const fleetWant = "a fleet's PostgreSQL store: fleet-wide reservations are shared by the hosts of a fleet, and the SQLite store has one host"

// fleet returns the Allocator's fleet store, or an error: the Allocator
// is closed, or its store is no store.FleetStore (it has no
// Config.StoreDSN).
func (a *Allocator) fleet() (store.FleetStore, error) {
	if a.isClosed() {
		return nil, ErrClosed
	}
	fs, ok := a.db().(store.FleetStore)
	if !ok {
		return nil, &FieldError{Field: "Config.StoreDSN", Value: dsn.Redact(a.cfg.StoreDSN), Want: fleetWant}
	}
	return fs, nil
}

// onFleet runs call on the fleet's store within Config.Timeout and puts
// its error in portalloc's words (see fleetErr). Without a fleet's store
// it fails as fleet does. Its errors have no prefix: package fleet's
// public calls add it.
func (a *Allocator) onFleet(ctx context.Context, call func(context.Context, store.FleetStore) error) error {
	fs, err := a.fleet()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	return a.fleetErr(call(ctx, fs))
}

// fleetErr puts an error of a fleet store's call into portalloc's words:
// portalloc's sentinel to test for, beside the store's. A refused field
// stays named as the store names the fields of its requests ("holder",
// "band", "ttl"), as a lease's are. nil stays nil.
func (a *Allocator) fleetErr(err error) error {
	var fe *FieldError
	switch {
	case err == nil, errors.As(err, &fe):
		return err
	case errors.Is(err, store.ErrClosed) && a.isClosed():
		return ErrClosed
	case errors.Is(err, store.ErrNotFound):
		return &fleetError{err: err, is: ErrNotHeld}
	case errors.Is(err, store.ErrStorage), errors.Is(err, store.ErrBusy), errors.Is(err, store.ErrTransient), errors.Is(err, store.ErrClosed):
		return &fleetError{err: err, is: ErrStoreUnavailable}
	}
	// The store's message starts with what it did ("reserve a fleet-wide
	// tcp port on ..."); its sentinels (ErrRangeExhausted,
	// ErrInvalidRequest) are portalloc's.
	return err
}

// fleetError is an error of a fleet store that wraps a sentinel of
// portalloc's too: its message is the store's.
type fleetError struct {
	err error
	is  error
}

func (e *fleetError) Error() string { return e.err.Error() }

func (e *fleetError) Unwrap() []error { return []error{e.is, e.err} }

// keeper is a store whose losses are of rows, not of the store itself: a
// fleet's store (store.FleetStore), whose Check reports (pgstore's
// LostError) that rows of this process may be missing after a failover to
// a standby that had not received them, a registration of the host made
// again, a forced retirement, or at every lease renewal. The holders
// compare what they hold with the store, put back what is missing, and
// say so (Checked); the store is not reopened.
type keeper = store.FleetStore

// release is a release this Allocator made on a fleet's store, kept so
// that it can be done again: a failover to a standby that had not received
// it brings the row back, and a release that failed while the store could
// not be reached left the row in place.
type release struct {
	at     time.Time
	failed bool // not done yet: kept until it is
}

// Releases done are kept redoWindow, at most maxRedo of them; failed ones
// until they are done.
const (
	redoWindow = 10 * time.Minute
	maxRedo    = 4096
)

// noteRelease records the release of r on s, which err says failed or not,
// when s is a fleet's store.
func (a *Allocator) noteRelease(s store.Store, r Reservation, err error) {
	if _, ok := s.(keeper); !ok {
		return
	}
	failed := err != nil && !errors.Is(err, store.ErrNotFound)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.released == nil {
		a.released = map[store.Key]release{}
	}
	a.released[storeKey(r)] = release{at: now, failed: failed}
	if len(a.released) <= maxRedo {
		return
	}
	var oldest store.Key
	var first time.Time
	for k, e := range a.released {
		switch {
		case e.failed:
		case now.Sub(e.at) > redoWindow:
			delete(a.released, k)
		case first.IsZero() || e.at.Before(first):
			oldest, first = k, e.at
		}
	}
	if len(a.released) > maxRedo && !first.IsZero() {
		delete(a.released, oldest)
	}
}

// errReleasesFailed is the cause repairRows is given when it runs for
// releases that failed, with no loss reported.
var errReleasesFailed = errors.New("releases of this process failed while the fleet's store could not be reached")

// releasesFailed reports whether a release of the Allocator failed and is
// not done yet.
func (a *Allocator) releasesFailed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.released {
		if e.failed {
			return true
		}
	}
	return false
}

// releasesToRedo reports whether the Allocator keeps releases to do again
// should the store report a loss.
func (a *Allocator) releasesToRedo() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.released) > 0
}

// repairRows compares the reservations the Allocator holds with the rows
// of this process in s, a fleet's store that reported why (a
// pgstore.LostError): it puts back, without a probe (this process may be
// listening on the port), each one held that is missing, and deletes again
// each row this Allocator released that is back or still there while
// nothing in the process holds it. A reservation another process took
// meanwhile cannot be put back: that is logged as an error naming both
// owners, and counted in Stats.Lost. Once compared, s is told so; when the
// comparison cannot be made (the store is still out of reach), the next
// check tries again.
func (a *Allocator) repairRows(ctx context.Context, s keeper, why error) error {
	a.repairMu.Lock()
	defer a.repairMu.Unlock()
	if a.db() != store.Store(s) || a.isClosed() {
		return nil
	}
	self, err := statestore.Self()
	if err != nil {
		return fmt.Errorf("%w; identifying this process: %w", why, err)
	}
	// What was held before the listing and is missing from it was lost.
	held := a.Held()
	rows, err := s.List(ctx, store.Filter{OwnerPID: self.PID})
	if err != nil {
		a.log.V(1).Info("could not compare this process's reservations with the fleet's store; the next check tries again", "cause", why.Error(), "error", err.Error())
		return fmt.Errorf("%w; listing this process's reservations: %w", why, err)
	}
	have := make(map[store.Key]bool, len(rows))
	for _, row := range rows {
		if row.Owner.Same(self) {
			have[row.Key] = true
		}
	}
	put, failed := a.restore(ctx, s, held, have, "missing from the fleet's store")
	redone, pending := a.redo(ctx, s, have)
	a.ctr.restored.Add(int64(put))
	a.ctr.lost.Add(int64(failed))
	a.ctr.rereleased.Add(int64(redone))
	if put+failed+redone > 0 {
		a.warn.Info("this process's reservations differed from the fleet's store; put back those missing and released again those released",
			"store", a.dbPath, "host", a.cfg.Host, "cause", why.Error(), "restored", put, "notRestored", failed, "releasedAgain", redone)
	} else {
		a.log.V(1).Info("compared this process's reservations with the fleet's store: nothing missing", "cause", why.Error())
	}
	if pending == 0 {
		s.Checked(why)
	}
	return nil
}

// keyTurnWait is how long a comparison waits for a key's turn before it
// leaves the key to the next check.
const keyTurnWait = 50 * time.Millisecond

// redo does again each release of this Allocator whose row is in have
// (this process's rows in the store) while nothing in the process holds
// it, drops the releases done and past redoWindow, and returns how many it
// did again and how many failed.
func (a *Allocator) redo(ctx context.Context, s store.Store, have map[store.Key]bool) (redone, pending int) {
	now := time.Now()
	a.mu.Lock()
	todo := make(map[store.Key]release, len(a.released))
	for k, e := range a.released {
		if !e.failed && now.Sub(e.at) > redoWindow {
			delete(a.released, k)
			continue
		}
		todo[k] = e
	}
	a.mu.Unlock()
	for k, e := range todo {
		if !have[k] {
			if e.failed { // the row is gone: as good as released
				a.settleRelease(k, e, now)
			}
			continue
		}
		r := Reservation{Protocol: k.Protocol, Addr: k.Addr, Port: k.Port, Backend: BackendStateStore}
		rk := a.refKeyOf(r)
		// A grant or a release of the key may hold its turn and wait for
		// this comparison (repairMu): take the turn only briefly, and
		// leave the key to the next check when it is busy.
		lctx, cancel := context.WithTimeout(ctx, keyTurnWait)
		ent, err := refs.lock(lctx, rk)
		cancel()
		if err != nil {
			pending++
			continue
		}
		// Held again since (by this Allocator, another of the process,
		// a set or a pool): the row is theirs now.
		_, all := refs.count(ent, a)
		a.mu.Lock()
		_, mine := a.held[keyOf(r)]
		a.mu.Unlock()
		if all > 0 || mine {
			refs.unlock(rk, ent)
			a.settleRelease(k, e, now)
			continue
		}
		err = s.Release(ctx, k, store.Owner{})
		refs.unlock(rk, ent)
		switch {
		case err == nil:
			redone++
			a.warn.Info("released again a reservation of this process that was back in the fleet's store (a release lost in a failover, or one that failed)",
				"reservation", r.String(), "releasedAt", e.at.UTC().Format(time.RFC3339Nano))
			a.settleRelease(k, e, now)
		case errors.Is(err, store.ErrNotFound):
			a.settleRelease(k, e, now)
		default:
			pending++
			a.log.V(1).Info("could not release again a reservation of this process; the next check tries again", "reservation", r.String(), "error", err.Error())
		}
	}
	return redone, pending
}

// settleRelease marks the release of k, noted as e, done as of now, unless
// a newer one replaced it meanwhile. A release done is kept redoWindow from
// when it was made: a failover may still undo it.
func (a *Allocator) settleRelease(k store.Key, e release, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur, ok := a.released[k]
	if !ok || cur != e {
		return
	}
	if e.failed {
		e = release{at: now}
	}
	a.released[k] = e
}
