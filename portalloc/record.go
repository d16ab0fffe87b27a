package portalloc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// The record's changes other than grants: a hold dropped, a reservation
// handed to another process, every hold of an Allocator dropped, and
// copies of a reservation's lock for a child.

// release drops one hold of key by a. The last hold of the process
// deletes the row and lets go of the lock. A key a does not hold while
// another Allocator of the process does is a *store.FieldError, and
// changes nothing; a key nobody in the process holds is released in the
// store when the process owns its row there (made by an Allocator since
// closed, or handed to this process).
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

// drop ends e, the holding of key that nothing in the process holds any
// more: its row is deleted and its lock let go. A delete that fails (the
// store cannot be reached) is done again by a later reconcile: the record
// keeps the release.
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

// trimReleased drops the oldest releases done beyond maxReleased. The
// caller holds mu.
func (h *handle) trimReleased() {
	n := 0
	var oldest store.Key
	var first time.Time
	for k, e := range h.held {
		if e.released.IsZero() || e.failed {
			continue
		}
		n++
		if first.IsZero() || e.released.Before(first) {
			oldest, first = k, e.released
		}
	}
	if n > maxReleased {
		delete(h.held, oldest)
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

// transfer hands a's reservation of key to the running process pid: its
// row, and its lock (the process keeps the copy it inherited, if any; a
// keeper holds it otherwise). A reservation anything else in the process
// holds too is refused: the transfer would take it from them.
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
		switch err := k.Hold(0, e.lock); {
		case err == nil:
			kept = true
		case errors.Is(err, portlock.ErrNoKeeper):
			h.log.V(1).Info("no keeper on this system: the reservation is kept by its row in the store alone", "keeper", k.String())
		default:
			return fmt.Errorf("%w: %s could not take the reservation's lock: %w", keeperErr(err), k, err)
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

// dropAll drops every hold of a, Close's last step: the rows nothing else
// in the process holds are released. It waits for turn at most until ctx
// is done; past that, the holds are dropped from the record anyway, and
// what it could not release is reaped once this process exits.
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
	var last []store.Key
	for k, e := range h.held {
		if e.by[a] == 0 {
			continue
		}
		delete(e.by, a)
		if e.holds() == 0 && e.released.IsZero() {
			last = append(last, k)
		}
	}
	h.mu.Unlock()
	var errs []error
	for _, k := range last {
		h.mu.Lock()
		e := h.held[k]
		h.mu.Unlock()
		if err := h.drop(ctx, k, e); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", k, err))
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
