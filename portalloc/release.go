package portalloc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// Release gives r back. It never needs to fail the caller: the error it
// returns is for logging, and a reservation that could not be released is
// reaped once its owner exits.
//
// It drops one hold of r by this Allocator: the row is deleted, and the
// port's lock let go, only when no other hold of it remains in this
// process (another Reserve of the same port, a set or pool of this or
// another Allocator). Releasing a reservation this Allocator does not hold
// while another Allocator of the process does is an error, and deletes
// nothing. A named holder's reservation (r.Owner.Holder) is released for
// its holder.
//
// A release goes on when ctx is cancelled or its deadline passes: ctx
// gives only its values, and the release has a deadline of its own,
// Config.Timeout. Shutdown is where contexts end (a deferred Release under
// signal.NotifyContext runs after the signal cancelled ctx), and a port
// that stayed reserved because of it would be lost until this process
// exits. A Release that returns nil has released.
func (a *Allocator) Release(ctx context.Context, r store.Reservation) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.Timeout)
	defer cancel()
	op := "release " + r.String()
	if a.closed.Load() {
		return opError(op, fmt.Errorf("%w (Close has released everything the Allocator held)", store.ErrClosed))
	}
	if r.Owner.Holder != "" {
		n, err := a.releaseHolder(ctx, r.Owner.Holder, store.Filter{Protocol: r.Protocol, Port: r.Port}, r.Addr)
		if n == 0 && errors.Is(err, store.ErrNotFound) {
			// Its row was lost with the store while the holder's keeper
			// keeps its lock (see Renew): the lock is the reservation.
			if held, kerr := portlock.HolderKeeper(r.Owner.Holder).Drop(string(r.Protocol), r.Addr, r.Port); kerr == nil && held {
				err = nil
			}
		}
		return opError(op, err)
	}
	err := a.h.release(ctx, a, r.Key)
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w (released already, reaped, or transferred)", store.ErrNotFound)
	}
	return opError(op, err)
}

// Transfer hands r to the running process pid, typically a child the
// caller has just started: the port then stays reserved exactly as long as
// that process runs, even if the caller exits first, and is reaped once it
// has exited. Its lock goes with it: a child that inherited a copy (Files,
// before it started) keeps it; otherwise, on Linux, a keeper process holds
// it for as long as pid runs (see package portlock). Transferred to this
// very process, the reservation is the process's own past its Allocators
// (Close no longer releases it), its lock held until the process exits.
//
// A reservation belongs to the process, not to one Allocator: Transfer
// refuses, with a *store.FieldError that names the other holders, one that
// anything else in this process holds too (another Allocator, a set or
// pool, or a second Reserve of the same port), since the transfer would
// take the port from them.
func (a *Allocator) Transfer(ctx context.Context, r store.Reservation, pid int) error {
	op := fmt.Sprintf("transfer %s to pid %d", r, pid)
	if a.closed.Load() {
		return opError(op, store.ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	return opError(op, a.h.transfer(ctx, a, r.Key, pid))
}

// Renew starts the lease of every reservation of holder over, at ttl from
// now, and returns how many there are: an error wrapping store.ErrNotFound
// when it has none whose lease has not ended (an ended lease is never
// revived: its port may be another's by now; get the ports again). The
// holder's keeper (see package portlock) keeps the ports locked for the
// same ttl; where the store lost the holder's rows (its file removed or
// replaced) while the keeper still holds their locks, the locks are what
// count, and the ports stay the holder's. A keeper that cannot be asked (a
// shortage of descriptors) fails the call wrapping store.ErrTransient:
// renew again.
func (a *Allocator) Renew(ctx context.Context, holder string, ttl time.Duration) (int, error) {
	if a.closed.Load() {
		return 0, opError("renew", store.ErrClosed)
	}
	if err := store.CheckTTL(ttl); err != nil {
		return 0, opError("renew", err)
	}
	if err := checkHolder(holder); err != nil {
		return 0, opError("renew", err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	locked, kerr := portlock.HolderKeeper(holder).Renew(ttl)
	var n int
	err := a.h.read(ctx, func(s store.Store) (err error) {
		n, err = s.Renew(ctx, holder, ttl)
		return err
	})
	if (err == nil || errors.Is(err, store.ErrNotFound)) && locked > n {
		a.log.Info("the store lacks rows of a holder whose keeper holds their locks (the store was lost or replaced): the locks keep the ports", "holder", holder, "rows", n, "locks", locked)
		return locked, nil
	}
	if (err == nil || errors.Is(err, store.ErrNotFound)) && kerr != nil && !errors.Is(kerr, portlock.ErrNoKeeper) {
		// The keeper's locks, which keep the lease where the store loses its rows, were not renewed.
		why := store.ErrUnavailable
		if transient(kerr) {
			why = store.ErrTransient
		}
		return 0, opError("renew", fmt.Errorf("%w: the keeper of holder %q could not renew its locks: %w", why, holder, kerr))
	}
	if err != nil {
		return 0, opError("renew", err)
	}
	return n, nil
}

// ReleaseHolder releases the reservations of the named holder that match f
// (f.Holder and f.OwnerPID must be zero; f.Label is of this Allocator's
// scope) and returns how many: an error wrapping store.ErrNotFound when
// there are none. Like Release, it goes on when ctx is cancelled, within
// Config.Timeout.
func (a *Allocator) ReleaseHolder(ctx context.Context, holder string, f store.Filter) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.Timeout)
	defer cancel()
	op := fmt.Sprintf("release the reservations of holder %q", holder)
	if a.closed.Load() {
		return 0, opError(op, store.ErrClosed)
	}
	if f.Holder != "" || f.OwnerPID != 0 {
		return 0, opError(op, &store.FieldError{Field: "Filter", Value: fmt.Sprintf("holder %q, owner pid %d", f.Holder, f.OwnerPID), Want: "neither: the holder is ReleaseHolder's argument"})
	}
	f.Label = scopeLabel(a.cfg.Scope, f.Label)
	n, err := a.releaseHolder(ctx, holder, f, netip.Addr{})
	return n, opError(op, err)
}

// releaseHolder deletes holder's rows that match f (and, when addr is
// valid, of that address), and has its keeper let go of their locks.
func (a *Allocator) releaseHolder(ctx context.Context, holder string, f store.Filter, addr netip.Addr) (int, error) {
	if err := checkHolder(holder); err != nil {
		return 0, err
	}
	if f.Label != "" {
		if err := store.CheckLabel(f.Label); err != nil {
			return 0, named("Filter.Label", err)
		}
	}
	f.Holder = holder
	keeper := portlock.HolderKeeper(holder)
	n := 0
	err := a.h.read(ctx, func(s store.Store) error {
		rows, err := s.List(ctx, f)
		if err != nil {
			return err
		}
		var errs []error
		for _, r := range rows {
			if addr.IsValid() && r.Addr != addr {
				continue
			}
			if err := s.Release(ctx, r.Key, store.Owner{Holder: holder}); err != nil {
				if !errors.Is(err, store.ErrNotFound) {
					errs = append(errs, err)
				}
				continue
			}
			n++
			if _, err := keeper.Drop(string(r.Protocol), r.Addr, r.Port); err != nil {
				a.log.V(1).Info("the keeper of a holder could not let go of a lock; it does when its lease ends", "holder", holder, "reservation", r.String(), "error", err.Error())
			}
		}
		return errors.Join(errs...)
	})
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: holder %q holds no such reservation (none was made, it was released, or its lease has ended and it was reaped)", store.ErrNotFound, holder)
	}
	return n, err
}

// Reap deletes every reservation in the store whose owner has exited, or
// whose holder's lease has ended, and returns how many it deleted. The
// store also reaps on its own, in the background and whenever a dead
// owner's row stands in the way; Reap just does it now. In ModeMRU there
// is nothing to reap.
func (a *Allocator) Reap(ctx context.Context) (int, error) {
	if a.closed.Load() {
		return 0, opError("reap", store.ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	if a.cfg.Mode == ModeMRU {
		return 0, nil
	}
	var n int
	err := a.h.read(ctx, func(s store.Store) (err error) {
		n, err = s.Reap(ctx)
		return err
	})
	return n, opError("reap", err)
}

// checkHolder refuses a holder's name no reservation can have with a
// *store.FieldError, the empty one too (store.Owner's for this process).
func checkHolder(holder string) error {
	if holder == "" {
		return &store.FieldError{Field: "holder", Value: "", Want: fmt.Sprintf("the name of a holder, 1 to %d bytes of printable UTF-8 such as \"ci/job-4711\"; it is empty", store.MaxHolderLen)}
	}
	return (store.Owner{Holder: holder}).Validate()
}

// release drops one hold of key by a, as Allocator.Release says. A key
// nobody in the process holds is released in the store when the process
// owns its row there (made by an Allocator since closed, or handed to it).
func (h *handle) release(ctx context.Context, a *Allocator, key store.Key) error {
	if err := h.lockTurn(ctx); err != nil {
		return err
	}
	defer h.unlockTurn()
	h.mu.Lock()
	e := h.held[key]
	if e == nil || !e.released.IsZero() {
		h.mu.Unlock()
		if e != nil && e.failed {
			return nil // released already, to be done again in the store
		}
		return h.do(ctx, func(s store.Store) error { return s.Release(ctx, key, store.Owner{}) })
	}
	if e.by[a] == 0 {
		others := describe(e, a)
		h.mu.Unlock()
		return &store.FieldError{Field: "Reservation", Value: key.String(),
			Want: fmt.Sprintf("a reservation this Allocator holds; %s holds it and releases it", others)}
	}
	if e.by[a]--; e.by[a] == 0 {
		delete(e.by, a)
	}
	left := e.holds()
	h.mu.Unlock()
	if left > 0 {
		h.log.V(1).Info("released a hold; the port stays reserved for the other holders in this process", "reservation", key.String(), "holds", left)
		return nil
	}
	return h.drop(ctx, key, e)
}

// drop deletes the row of e, which nothing in the process holds any more,
// and lets go of its lock. A delete that fails stays in the record, for a
// later reconcile to do again.
func (h *handle) drop(ctx context.Context, key store.Key, e *holding) error {
	var err error
	if !e.mru {
		err = h.do(ctx, func(s store.Store) error { return s.Release(ctx, key, store.Owner{}) })
		if errors.Is(err, store.ErrNotFound) {
			err = nil // lost with the store, or reaped: nothing to delete
		}
	}
	h.mu.Lock()
	if e.lock != nil {
		_ = e.lock.Close()
		e.lock = nil
	}
	if e.mru {
		delete(h.held, key)
	} else {
		e.released, e.failed = time.Now(), err != nil
		if err != nil {
			h.again = true
		}
		h.trimReleased()
	}
	h.mu.Unlock()
	return err
}

// trimReleased keeps at most maxReleased releases done, dropping the oldest down to three
// quarters of it: the record is scanned once in a thousand releases. The caller holds mu.
func (h *handle) trimReleased() {
	if len(h.held) <= maxReleased {
		return
	}
	var done []store.Key
	for k, e := range h.held {
		if !e.released.IsZero() && !e.failed {
			done = append(done, k)
		}
	}
	if len(done) <= maxReleased {
		return
	}
	slices.SortFunc(done, func(a, b store.Key) int { return h.held[a].released.Compare(h.held[b].released) })
	for _, k := range done[:len(done)-maxReleased*3/4] {
		delete(h.held, k)
	}
}

// describe names the holders of e other than a, for messages.
func describe(e *holding, a *Allocator) string {
	var out []string
	for other, n := range e.by {
		if other == a {
			continue
		}
		w := "another Allocator of this process"
		if n > 1 {
			w += " (" + strconv.Itoa(n) + " holds)"
		}
		out = append(out, w)
	}
	return strings.Join(out, ", ")
}

// transfer is Allocator.Transfer of a's reservation of key.
func (h *handle) transfer(ctx context.Context, a *Allocator, key store.Key, pid int) error {
	if err := h.lockTurn(ctx); err != nil {
		return err
	}
	defer h.unlockTurn()
	h.mu.Lock()
	e := h.held[key]
	switch {
	case e == nil || !e.released.IsZero():
		h.mu.Unlock()
		return fmt.Errorf("%w (released already, reaped, or transferred)", store.ErrNotFound)
	case e.by[a] == 0:
		others := describe(e, a)
		h.mu.Unlock()
		return &store.FieldError{Field: "Reservation", Value: key.String(), Want: fmt.Sprintf("a reservation this Allocator holds; %s holds it", others)}
	case e.holds() > 1:
		n := e.holds()
		others := describe(e, a)
		h.mu.Unlock()
		if others == "" {
			others = strconv.Itoa(n) + " holds of this Allocator (Reserve, sets and pools each take one)"
		}
		return &store.FieldError{Field: "Reservation", Value: key.String(),
			Want: fmt.Sprintf("a reservation nothing else in this process holds; %s hold it too: release it there first (a transfer would take it from them)", others)}
	}
	h.mu.Unlock()
	to, err := store.LookupOwner(ctx, pid)
	if err != nil {
		return err
	}
	// The lock first: the process inherited a copy (Files), or its keeper
	// takes one; only then is the row given to it. This process's copy
	// goes once both are done.
	var k portlock.Keeper
	kept := false
	if e.lock != nil && !e.lock.HeldBy(pid) {
		if k, err = portlock.ProcessKeeper(pid); err != nil {
			return fmt.Errorf("%w: pid %d has exited: %w", store.ErrNotFound, pid, err)
		}
		if kept, err = h.hold(k, 0, e.lock); err != nil {
			return err
		}
	}
	if !e.mru {
		if err := h.do(ctx, func(s store.Store) error { return s.Transfer(ctx, key, store.Owner{}, to) }); err != nil {
			if kept {
				_, _ = k.Drop(string(key.Protocol), key.Addr, key.Port)
			}
			return err
		}
	}
	h.mu.Lock()
	delete(h.held, key)
	h.mu.Unlock()
	switch {
	case e.lock == nil:
	case pid == h.self.PID:
		// Handed to this very process, past its Allocators: the lock is
		// its own until it exits (berth run keeps copies across exec).
		selfKept.mu.Lock()
		selfKept.locks = append(selfKept.locks, e.lock)
		selfKept.mu.Unlock()
	default:
		_ = e.lock.Close()
	}
	return nil
}

// dropAll drops every hold of a, for Close. Past ctx it drops them from the
// record without releasing: reaping covers them once this process exits.
func (h *handle) dropAll(ctx context.Context, a *Allocator) error {
	if err := h.lockTurn(ctx); err != nil {
		h.mu.Lock()
		for _, e := range h.held {
			delete(e.by, a)
		}
		h.mu.Unlock()
		return err
	}
	defer h.unlockTurn()
	h.mu.Lock()
	var last []*holding
	for _, e := range h.held {
		if e.by[a] == 0 {
			continue
		}
		delete(e.by, a)
		if e.holds() == 0 && e.released.IsZero() {
			last = append(last, e)
		}
	}
	h.mu.Unlock()
	var errs []error
	for _, e := range last {
		if err := h.drop(ctx, e.row.Key, e); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", e.row.Key, err))
		}
	}
	return errors.Join(errs...)
}

// files returns copies of the lock of a's reservation of key.
func (h *handle) files(a *Allocator, key store.Key) ([]*os.File, error) {
	h.mu.Lock()
	e := h.held[key]
	if e == nil || e.by[a] == 0 || !e.released.IsZero() {
		h.mu.Unlock()
		return nil, fmt.Errorf("%w (released already, reaped, or transferred)", store.ErrNotFound)
	}
	lk := e.lock
	h.mu.Unlock()
	if lk == nil {
		return nil, nil // its lock is held by this process's keeper
	}
	return lk.Files()
}
