package portalloc

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-go/berth/store"
)

// A row Transfer gives to a child belongs to the child: it stays reserved
// while the child runs, even if this process dies first. Once the child
// has exited, the row is dead, and the store reaps it when it stands in
// the way, in the background, or on a Reap. A set's Release (package portset) and Close do not
// wait for that: they release the rows this Allocator handed to children
// that have exited by then, so that a program that starts children,
// transfers their ports and releases its set leaves nothing behind.

// handed is a row Transfer gave to another process: its owner then, and
// the hold it came from ("" for the Allocator's own, or a set's via).
type handed struct {
	r   Reservation
	to  store.Owner
	via string
}

// handedPrune is the least number of handed rows at which a Transfer
// first looks for exited owners among them, so that a long-running
// supervisor that hands ports to child after child, and never releases a
// set or closes, keeps a bounded list: each time the list reaches twice
// what the last look left (at least handedPrune), it looks again.
const handedPrune = 256

// handOver records that r now belongs to to, and reports whether the
// list has grown enough to look for exited owners in it.
func (a *Allocator) handOver(r Reservation, to store.Owner, via string) (prune bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handed == nil {
		a.handed = map[heldKey]handed{}
	}
	a.handed[keyOf(r)] = handed{r, to, via}
	return len(a.handed) >= max(handedPrune, a.handedPruneAt)
}

// pruneHanded releases the handed rows of exited owners, whoever handed
// them over; it is for logging only, like a failed release.
func (a *Allocator) pruneHanded(ctx context.Context, s store.Store) {
	if err := a.reapHanded(ctx, s, func(handed) bool { return true }, false); err != nil {
		a.log.Error(err, "releasing the ports of exited children")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handedPruneAt = 2 * len(a.handed)
}

// reapHanded releases the rows this Allocator handed over that match
// selects, whose owner has exited, and forgets them. The row is deleted
// only while that owner still holds it: a port the store has already
// reaped and granted again is left alone. Rows of owners that still run
// stay theirs; with forget (Close) they are forgotten too.
func (a *Allocator) reapHanded(ctx context.Context, s store.Store, match func(handed) bool, forget bool) error {
	a.mu.Lock()
	var todo []handed
	for k, h := range a.handed {
		if match(h) {
			todo = append(todo, h)
			delete(a.handed, k)
		}
	}
	a.mu.Unlock()
	var failed, keep []handed
	var why []error
	for _, h := range todo {
		if h.to.Alive(ctx) {
			keep = append(keep, h)
			continue
		}
		if s == nil {
			continue
		}
		err := s.Release(ctx, storeKey(h.r), h.to)
		switch {
		case err == nil:
			a.log.V(1).Info("released a port of an exited child", "reservation", h.r.String(), "pid", h.to.PID)
		case errors.Is(err, store.ErrNotFound):
			// Reaped already, or granted again since.
		default:
			failed = append(failed, h)
			why = append(why, fmt.Errorf("release %s of exited pid %d: %w", h.r, h.to.PID, err))
		}
	}
	if !forget {
		// Children still running keep their rows; a later Release or
		// Close looks again, and so does one after a failed release.
		a.mu.Lock()
		if a.handed != nil {
			for _, h := range append(keep, failed...) {
				a.handed[keyOf(h.r)] = h
			}
		}
		a.mu.Unlock()
	}
	return errors.Join(why...)
}
