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
// the way, in the background, or on a Reap. Set.Release and Close do not
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

// handOver records that r now belongs to to.
func (a *Allocator) handOver(r Reservation, to store.Owner, via string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handed == nil {
		a.handed = map[heldKey]handed{}
	}
	a.handed[keyOf(r)] = handed{r, to, via}
}

// reapHanded releases the rows this Allocator handed over by via (by any
// hold, when all) whose owner has exited, and forgets them. The row is
// deleted only while that owner still holds it: a port the store has
// already reaped and granted again is left alone. Rows of owners that
// still run stay theirs; all (Close) forgets them too.
func (a *Allocator) reapHanded(ctx context.Context, s store.Store, via string, all bool) error {
	a.mu.Lock()
	var todo []handed
	for k, h := range a.handed {
		if all || h.via == via {
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
	if !all {
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
