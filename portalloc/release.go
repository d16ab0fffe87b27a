package portalloc

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// Release gives r back. It never needs to fail the caller: the error it
// returns is for logging, and a reservation that could not be released is
// reaped once this process exits.
//
// It releases one hold of r by this Allocator. The row is deleted only when
// no other hold of it remains in this process: another Reserve of the same
// port, a set or pool of this or another Allocator. Releasing a reservation
// this Allocator does not hold while another holder of the process does is
// an error, and deletes nothing.
//
// A reservation of a holder under a lease (r.Holder set) is released for
// its holder, as package lease's Release releases its port.
//
// A release goes on when ctx is cancelled or its deadline passes: ctx
// gives only its values, and the release has a deadline of its own,
// Config.Timeout. Shutdown is where contexts end (a deferred Release under
// signal.NotifyContext runs after the signal cancelled ctx), and a port
// that stayed reserved because of it would be lost until this process
// exits. A Release that returns nil has released.
func (a *Allocator) Release(ctx context.Context, r Reservation) error {
	ctx, cancel := a.releaseContext(ctx)
	defer cancel()
	if r.Holder != "" {
		_, err := a.releaseHolder(ctx, r.Holder, store.Filter{Protocol: r.Protocol, Port: r.Port})
		return opError(releaseHolderOp(r.Holder), err)
	}
	return opError("", a.release(ctx, r, "", false)) // its errors say "release <r>"
}

// releaseContext is the context of a release: ctx's values without its
// cancellation, bounded by Config.Timeout.
func (a *Allocator) releaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), a.cfg.Timeout)
}

// release drops one hold of r by via. With keepRow it never deletes the
// row: a set allocation (portset.Allocate) that fails leaves rows that
// existed before it. Its errors begin "release <r>: ", without the
// package's prefix.
func (a *Allocator) release(ctx context.Context, r Reservation, via string, keepRow bool) error {
	if a.isClosed() {
		return fmt.Errorf("release %s: %w (Close has released everything the Allocator held)", r, ErrClosed)
	}
	s, err := a.rowStore(r)
	if err != nil {
		return fmt.Errorf("release %s: %w", r, err)
	}
	if s == nil {
		// The MRU file keeps the port as recently handed out until it expires.
		a.unhold(r, false)
		return nil
	}
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return fmt.Errorf("release %s: %w", r, err)
	}
	defer refs.unlock(rk, e)
	// A repair (which puts back what the Allocator holds) waits for the
	// hold to go and the row with it, so that it never puts back a row
	// just released (see repairMu).
	a.repairMu.RLock()
	had, left := refs.drop(e, a, via)
	if had > 0 {
		a.unhold(r, false)
	}
	switch {
	case left > 0 && had > 0:
		a.repairMu.RUnlock()
		a.log.V(1).Info("released a hold; the port stays reserved for the other holders in this process", "reservation", r.String(), "holds", left)
		return nil
	case left > 0:
		a.repairMu.RUnlock()
		return fmt.Errorf("release %s: %w", r, &FieldError{Field: "Reservation", Value: r.String(),
			Want: fmt.Sprintf("a reservation this Allocator holds; %s holds it and releases it", refs.describe(e, a, via))})
	case keepRow:
		a.repairMu.RUnlock()
		return nil
	}
	// The last hold in this process, or a row nobody here tracks (made by
	// an Allocator since closed, or handed to this process).
	err = s.Release(ctx, storeKey(r), store.Owner{})
	a.repairMu.RUnlock()
	for try, on := 0, s; err != nil && try < maxReplacements; try++ {
		var again bool
		if again, err = a.replaced(ctx, on, err); !again {
			break
		}
		// The file was lost: what it held went with it, but the new
		// store may have the row back from this process's mark.
		on = a.db()
		if err = on.Release(ctx, storeKey(r), store.Owner{}); errors.Is(err, store.ErrNotFound) {
			err = nil
		}
	}
	a.noteRelease(s, r, err)
	if err != nil {
		return a.rowErr("release", r, err)
	}
	return nil
}

// Transfer hands r to the running process pid, typically a child the caller
// has just started: the port then stays reserved exactly as long as that
// process runs, even if the caller exits first, and Close no longer
// releases it while that process runs; once it has exited, Close (or the
// Release of the set that handed it over) releases it, without waiting
// for the store to reap it. Reservations of the MRU backend have no owner; for them
// Transfer only stops this Allocator from tracking the port.
//
// A row is owned by the process, not by one Allocator: Transfer refuses,
// with an error wrapping ErrInvalidRequest that names the other holders,
// when anything else in this process holds r too (another Allocator, a set
// or pool, or a second Reserve of the same port), since the transfer would
// take the port from them.
func (a *Allocator) Transfer(ctx context.Context, r Reservation, pid int) error {
	return opError("", a.transfer(ctx, r, pid, "")) // its errors say "transfer <r>"
}

// transfer is Transfer with the holds of via. Its errors begin
// "transfer <r>", without the package's prefix.
func (a *Allocator) transfer(ctx context.Context, r Reservation, pid int, via string) error {
	if a.isClosed() {
		return fmt.Errorf("transfer %s: %w", r, ErrClosed)
	}
	s, err := a.rowStore(r)
	if err != nil {
		return fmt.Errorf("transfer %s: %w", r, err)
	}
	if s == nil { // an MRU reservation has no owner to change
		a.unhold(r, true)
		return nil
	}
	to, err := statestore.LookupOwner(ctx, pid)
	if err != nil {
		return fmt.Errorf("transfer %s: %w: %w", r, &FieldError{Field: "pid", Value: strconv.Itoa(pid), Want: "the pid of a running process"}, err)
	}
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return fmt.Errorf("transfer %s to pid %d: %w", r, pid, err)
	}
	defer refs.unlock(rk, e)
	if mine, all := refs.count(e, a); all > 1 || all > mine {
		return fmt.Errorf("transfer %s to pid %d: %w", r, pid, sharedError(r, refs.describe(e, a, via)))
	}
	key := storeKey(r)
	// A repair (which puts back what the Allocator holds) waits from the
	// store's transfer to the hold's end, so that it never puts back, as
	// this process's, a row just handed over (see repairMu).
	handOff := func(on store.Store) error {
		a.repairMu.RLock()
		defer a.repairMu.RUnlock()
		err := on.Transfer(ctx, key, store.Owner{}, to)
		if err != nil && on != s && handedAlready(ctx, on, key, to) {
			// The store made anew took in to's row from its mark, which
			// the failed Transfer then dropped: handing the row from to to
			// itself makes the mark again.
			err = on.Transfer(ctx, key, to, to)
		}
		if err != nil {
			return err
		}
		refs.dropAll(e, a)
		a.unhold(r, true)
		return nil
	}
	a.startHanding(r, to)
	defer a.stopHanding(r)
	err = handOff(s)
	for try, on := 0, s; err != nil && try < maxReplacements; try++ {
		var again bool
		if again, err = a.replaced(ctx, on, err); !again {
			break
		}
		on = a.db()
		err = handOff(on) // the row is back
	}
	if err != nil {
		return a.rowErr(fmt.Sprintf("transfer to pid %d of", pid), r, err)
	}
	if a.handOver(r, to, via) {
		a.pruneHanded(ctx, a.db())
	}
	return nil
}

// startHanding records that a Transfer of r to to is in progress (see
// Allocator.handing); stopHanding that it has ended.
func (a *Allocator) startHanding(r Reservation, to store.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handing == nil {
		a.handing = map[heldKey]store.Owner{}
	}
	a.handing[keyOf(r)] = to
}

func (a *Allocator) stopHanding(r Reservation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.handing, keyOf(r))
}

// handingTo reports whether a Transfer in progress hands r to owner.
func (a *Allocator) handingTo(r Reservation, owner store.Owner) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	to, ok := a.handing[keyOf(r)]
	return ok && to.Same(owner)
}

// handedAlready reports whether the row of key in on, a store opened
// again after the one a Transfer started on was lost, is to's already: the
// new store took it in from the mark the Transfer made for to.
func handedAlready(ctx context.Context, on store.Store, key store.Key, to store.Owner) bool {
	rows, err := on.List(ctx, store.Filter{Protocol: key.Protocol, Port: key.Port})
	if err != nil {
		return false
	}
	for _, row := range rows {
		if row.Addr == key.Addr && row.Owner.Same(to) {
			return true
		}
	}
	return false
}

// Reap deletes every reservation in the store whose owner has exited, for
// example those of children that were handed ports and have stopped, and
// returns how many it deleted. The store also reaps on its own, in the
// background and whenever a dead owner's row stands in the way; Reap just
// does it now. In the MRU backend there is nothing to reap.
func (a *Allocator) Reap(ctx context.Context) (int, error) {
	if a.isClosed() {
		return 0, opError("reap", ErrClosed)
	}
	s := a.db()
	if s == nil {
		return 0, nil
	}
	n, err := s.Reap(ctx)
	return n, opError("reap", a.closedErr(err))
}

// rowStore returns the state store that holds r's row, or nil for a
// reservation of the MRU file. A reservation of neither backend, or of a
// store this Allocator does not have open, is a *FieldError.
func (a *Allocator) rowStore(r Reservation) (store.Store, error) {
	switch r.Backend {
	case BackendMRU:
		return nil, nil
	case BackendStateStore:
	default:
		return nil, &FieldError{Field: "Reservation.Backend", Value: string(r.Backend), Want: fmt.Sprintf("%q or %q", BackendStateStore, BackendMRU)}
	}
	s := a.db()
	if s == nil {
		return nil, &FieldError{Field: "Reservation", Value: r.String(),
			Want: "a reservation of this Allocator, which serves from the MRU file and has no state store to change it in"}
	}
	return s, nil
}
