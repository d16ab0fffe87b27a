package portalloc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/berth-go/berth/store"
)

// defaultCheckInterval is how often an Allocator that holds reservations asks its
// store whether they may have been lost (store.Checker): the state store's
// file deleted (a cache cleaner, rm -rf), replaced or truncated. When they
// may have, it reopens the store and puts them back (see "Losing the store"
// in the package documentation). Every write finds a loss at once; the
// check finds it for an Allocator that is idle.
const defaultCheckInterval = time.Second

// checkEvery, in nanoseconds, overrides defaultCheckInterval when it is not zero:
// tests shorten it.
var checkEvery atomic.Int64

func checkInterval() time.Duration {
	if d := checkEvery.Load(); d > 0 {
		return time.Duration(d)
	}
	return defaultCheckInterval
}

// watch asks the store every checkInterval whether it was lost while the
// Allocator holds something in it, and repairs it. Close stops it.
func (a *Allocator) watch() {
	defer a.bg.Done()
	t := time.NewTicker(checkInterval())
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		s := a.db()
		c, ok := s.(store.Checker)
		if !ok || (!a.holdsStoreRows() && !a.releasesToRedo()) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
		if err := c.Check(ctx); errors.Is(err, store.ErrLost) {
			_ = a.repair(ctx, s, err) // logged; the next call or check tries again
		} else if k, ok := s.(keeper); ok && err == nil && a.releasesFailed() {
			_ = a.repairRows(ctx, k, errReleasesFailed) // until they are done
		} else if err == nil && a.restoreAgain.Load() {
			a.repairMu.Lock()
			if a.db() == s {
				put, failed := a.restore(ctx, s, a.Held(), nil, lostWithFile)
				a.ctr.restored.Add(int64(put))
				a.ctr.lost.Add(int64(failed))
			}
			a.repairMu.Unlock()
		}
		cancel()
	}
}

// holdsStoreRows reports whether the Allocator holds a row of the state
// store.
func (a *Allocator) holdsStoreRows() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.held {
		if k.backend == BackendStateStore {
			return true
		}
	}
	return false
}

// replaced reports whether the call that failed with err on s should run
// again on the store the Allocator has now: s was replaced by a retry after
// a fallback, or s lost its file and repair has put a new store, with the
// Allocator's rows back in it, in its place.
//
// It returns the error to report when the call is not to run again: err,
// or why a lost store could not be opened again (a damaged file, say, which
// the caller's mode may fall back for).
func (a *Allocator) replaced(ctx context.Context, s store.Store, err error) (bool, error) {
	if errors.Is(err, store.ErrLost) {
		if rerr := a.repair(ctx, s, err); rerr != nil {
			return false, rerr
		}
	} else if !errors.Is(err, store.ErrClosed) {
		return false, err
	}
	cur := a.db()
	return cur != nil && cur != s, err
}

// repair replaces lost, a store whose file was lost, by the store at the
// same place opened afresh, and puts back in it every reservation the
// Allocator holds. One call repairs; others that find lost already replaced
// return at once. A reservation that another process took meanwhile cannot
// be put back: that is logged as an error naming both owners, and counted
// in Stats.Lost. When the store cannot be opened again, the Allocator keeps
// the lost one, whose calls go on failing with ErrLost, tries again at the
// next call or check, and returns why it could not.
func (a *Allocator) repair(ctx context.Context, lost store.Store, why error) error {
	if k, ok := lost.(keeper); ok {
		// A fleet's store: the rows went missing, not the store.
		return a.repairRows(ctx, k, why)
	}
	a.repairMu.Lock()
	defer a.repairMu.Unlock()
	if a.db() != lost || a.isClosed() {
		return nil
	}
	if t, ok := lost.(interface {
		SetAsideIfTruncated(context.Context) (bool, error)
	}); ok {
		// A file truncated under its holders, into which a checkpoint
		// has written pages back, looks damaged to everyone else: the
		// holders, who know what became of it, move it aside.
		if _, err := t.SetAsideIfTruncated(ctx); err != nil {
			a.log.V(1).Info("could not set a truncated store aside", "database", a.dbPath, "error", err.Error())
		}
	}
	s, err := a.openStore(ctx)
	for try := 1; err != nil && try < 3 && ctx.Err() == nil && !lasting(err); try++ {
		// Whatever lost the file may still be at work (a cleaner
		// removing the directory as it is made again): try again.
		time.Sleep(time.Duration(try) * 20 * time.Millisecond)
		s, err = a.openStore(ctx)
	}
	if err != nil {
		a.warn.Error(err, "the state store's file was lost and cannot be opened again; this process's reservations are not recorded until it can",
			"database", a.dbPath, "lost", why.Error())
		return fmt.Errorf("%w; opening it again: %w", why, err)
	}
	// The rows go back before the new store serves this Allocator's
	// calls: a Release that ran on the lost store meanwhile waits for this
	// repair, then releases in the new one, where it finds its row.
	put, failed := a.restore(ctx, s, a.Held(), nil, lostWithFile)
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		_ = s.Close()
		return nil
	}
	a.store.Store(&backing{s})
	a.mu.Unlock()
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		_ = lost.Close()
	}()
	a.ctr.restored.Add(int64(put))
	a.ctr.lost.Add(int64(failed))
	a.warn.Info("the state store's file was lost (deleted, replaced or truncated); opened it again and put back this process's reservations",
		"database", a.dbPath, "cause", why.Error(), "restored", put, "notRestored", failed)
	return nil
}

// restore puts back in s every row of the state store among held (what the
// Allocator holds) that have does not list (nil: none is there), and
// returns how many it put back and how many another owner holds now. where
// says, for the log, where the rows went missing.
//
// A reservation it could not put back for a passing reason (a shortage of
// descriptors, a busy store) is tried again at the next check. When s is
// lost in its turn (a cleaner still at work), restore stops: the rest
// would fail the same, and the next call or check opens the store again
// and puts them back there.
func (a *Allocator) restore(ctx context.Context, s store.Store, held []Reservation, have map[store.Key]bool, where string) (put, failed int) {
	a.restoreAgain.Store(false)
	for _, r := range held {
		if r.Backend != BackendStateStore || have[storeKey(r)] || !a.holds(r) {
			continue // released since held was read: not to be put back
		}
		// No probe: this process may be listening on the port already.
		_, err := s.Reserve(ctx, store.Request{Key: storeKey(r), Label: r.Label})
		var ce *ConflictError
		switch {
		case err == nil:
			put++
		case errors.As(err, &ce) && a.handingTo(r, ce.Holder.Owner):
			// A Transfer in progress hands r to that owner, whose row the
			// new store took in from its mark: the Transfer finds it there.
			a.log.V(1).Info("a reservation "+where+" is back as the process's it is being handed to", "reservation", r.String(), "holder", ce.Holder.Owner.String())
		case errors.As(err, &ce):
			failed++
			a.warn.Error(err, "a reservation "+where+" could not be put back: another process took the port meanwhile, and both may now use it",
				"reservation", r.String(), "holder", ce.Holder.Owner.String(), "pid", os.Getpid(), "host", a.cfg.Host)
		case errors.Is(err, store.ErrLost):
			a.log.V(1).Info("the state store's file was lost again while reservations "+where+" were put back; they go back when it is opened again",
				"database", a.dbPath, "error", err.Error())
			return put, failed
		case isTransient(err):
			// Out of descriptors, say: the next check tries again.
			a.restoreAgain.Store(true)
			a.warn.Error(err, "a reservation "+where+" could not be put back yet; trying again", "reservation", r.String(), "in", checkInterval().String())
		default:
			failed++
			a.warn.Error(err, "a reservation "+where+" could not be put back", "reservation", r.String())
		}
	}
	return put, failed
}

// holds reports whether the Allocator still holds r.
func (a *Allocator) holds(r Reservation) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.held[keyOf(r)]
	return ok
}

// lostWithFile is where restore says the rows of a lost SQLite file went.
const lostWithFile = "lost with the state store's file"

// lasting reports whether err of opening a store is one that trying again
// at once cannot mend.
func lasting(err error) bool {
	return errors.Is(err, store.ErrDamaged) || errors.Is(err, store.ErrUnsafe) || errors.Is(err, store.ErrSchemaTooNew)
}

// maxReplacements is how many times one call goes on with a store that
// replaced the one it failed on: a store lost again while the call ran
// again (a cleaner that keeps deleting) fails it after that.
const maxReplacements = 3
