package portalloc

import (
	"context"
	"net/netip"

	"github.com/berth-go/berth/store"
)

// heldKey names a reservation an Allocator holds. The backend is part of
// it: a port the MRU file handed out during a fallback and a row of the
// store are different things.
type heldKey struct {
	backend  string
	protocol Protocol
	addr     netip.Addr
	port     uint16
}

// holding is a reservation and how many holds of it the Allocator has:
// its own Reserve calls and those of its sets and pools.
type holding struct {
	r Reservation
	n int
}

func keyOf(r Reservation) heldKey { return heldKey{r.Backend, r.Protocol, r.Address, r.Port} }

// hold records one more hold of r by the Allocator. It returns false when
// the Allocator has been closed meanwhile.
func (a *Allocator) hold(r Reservation) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	k := keyOf(r)
	if h := a.held[k]; h != nil {
		h.n++
	} else {
		a.held[k] = &holding{r: r, n: 1}
	}
	a.log.V(1).Info("reserved port", "protocol", string(r.Protocol), "address", r.Address.String(), "port", r.Port, "label", r.Label, "backend", r.Backend)
	return true
}

// unhold removes one hold of r, or all of them.
func (a *Allocator) unhold(r Reservation, all bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := keyOf(r)
	if h := a.held[k]; h != nil {
		if h.n--; h.n <= 0 || all {
			delete(a.held, k)
		}
	}
}

// adopt takes a hold, by via, of r: a row this process already has in the
// store (an AllocateSet found it by its label).
func (a *Allocator) adopt(ctx context.Context, r Reservation, via string) (Reservation, error) {
	if r.Backend != BackendStateStore {
		if !a.hold(r) {
			return Reservation{}, ErrClosed
		}
		return r, nil
	}
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return Reservation{}, err
	}
	defer refs.unlock(rk, e)
	refs.add(e, a, via)
	if !a.hold(r) {
		refs.drop(e, a, via)
		return Reservation{}, ErrClosed
	}
	return r, nil
}

// Held returns the reservations this Allocator holds: made by it (or its
// sets and pools) and not yet released or transferred, each once. After
// Close it returns none.
func (a *Allocator) Held() []Reservation {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Reservation, 0, len(a.held))
	for _, h := range a.held {
		out = append(out, h.r)
	}
	return out
}

// dropHolds drops every hold of r by the Allocator, and releases the row if
// nobody else in the process holds it.
func (a *Allocator) dropHolds(ctx context.Context, s store.Store, r Reservation) error {
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		// Out of time: forget the holds anyway, so that the others'
		// counts stay right; the row is reaped after this process exits.
		refs.forget(rk, a)
		return err
	}
	defer refs.unlock(rk, e)
	if refs.dropAll(e, a) > 0 {
		return nil
	}
	return s.Release(ctx, storeKey(r), store.Owner{})
}
