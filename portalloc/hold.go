package portalloc

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/berth-go/berth/statestore"
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

func keyOf(r Reservation) heldKey { return heldKey{r.Backend, r.Protocol, r.Addr, r.Port} }

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
	a.log.V(1).Info("reserved port", "protocol", string(r.Protocol), "address", r.Addr.String(), "port", r.Port, "label", r.Label, "backend", r.Backend)
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
// store (a set (package portset) found it by its label).
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

// obtain reserves port for req, or allocates one when port is 0, with the
// hold taken by via.
func (a *Allocator) obtain(ctx context.Context, req Request, port uint16, via string) (r Reservation, err error) {
	defer func() { a.ctr.count(port != 0, err) }()
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	if port != 0 {
		return a.reserve(ctx, req, port, via)
	}
	return a.allocate(ctx, req, a.set, probeFunc(req), via)
}

// ownRows returns this process's reservations whose label starts with
// prefix, from the store (so a new Allocator finds what an earlier one of
// the same process holds) or, in the MRU backend, from this Allocator; and
// the keys of every row this process has in the store, or nil when they
// could not be read.
func (a *Allocator) ownRows(ctx context.Context, prefix string) (map[string]Reservation, map[heldKey]bool, error) {
	out := map[string]Reservation{}
	s := a.db()
	if a.fb.active.Load() || s == nil {
		for _, r := range a.Held() {
			if strings.HasPrefix(r.Label, prefix) {
				out[r.Label] = r
			}
		}
		return out, nil, nil
	}
	self, err := statestore.Self()
	if err != nil {
		return nil, nil, err
	}
	rows, err := s.List(ctx, store.Filter{OwnerPID: self.PID})
	if err != nil {
		if a.cfg.Mode == ModeStateStore || isTransient(err) {
			return nil, nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		return out, nil, nil // the allocations below fall back, and find nothing to reuse
	}
	before := map[heldKey]bool{}
	for _, r := range rows {
		if !r.Owner.Same(self) {
			continue
		}
		res := Reservation{Protocol: r.Protocol, Addr: r.Addr, Port: r.Port, Label: r.Label, Backend: BackendStateStore}
		before[keyOf(res)] = true
		if strings.HasPrefix(r.Label, prefix) {
			out[r.Label] = res
		}
	}
	return out, before, nil
}
