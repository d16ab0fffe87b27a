package portalloc

import (
	"context"

	"github.com/berth-go/berth/internal/probe"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// Reserve reserves the given port for req, whether or not it lies in the
// configured range. It returns a *ConflictError (errors.Is ErrPortHeld) when
// another process holds it, or when this process already holds a
// conflicting reservation (such as its own wildcard on the port). Reserving
// a port this process already holds on the same address returns it again,
// and takes another hold of it: the row stays until every Allocator, set
// and pool of the process that holds it has released it (see the package
// documentation).
func (a *Allocator) Reserve(ctx context.Context, req Request, port uint16) (r Reservation, err error) {
	defer func() { a.ctr.count(true, err) }()
	defer func() { err = opError("reserve", err) }()
	if port == 0 {
		return Reservation{}, &FieldError{Field: "port", Value: "0", Want: "a port from 1 to 65535 (Allocate chooses a free one)"}
	}
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	return a.reserve(ctx, req, port, "")
}

// reserve is Reserve after begin, with the hold taken by via.
func (a *Allocator) reserve(ctx context.Context, req Request, port uint16, via string) (Reservation, error) {
	if err := a.excl.refuseLocal("port", port, req.AllowOSReserved); err != nil {
		return Reservation{}, err
	}
	a.retryStore(ctx)
	if !a.fb.active.Load() {
		if r, done, err := a.reserveStore(ctx, req, port, via); done {
			return r, err
		}
	}
	return a.reserveMRU(ctx, req, port)
}

// reserveStore reserves in the state store. done is false when the store
// failed and the Allocator fell back.
func (a *Allocator) reserveStore(ctx context.Context, req Request, port uint16, via string) (Reservation, bool, error) {
	key := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: port}
	rk := refKey{store: a.dbKey, protocol: req.Protocol, addr: req.Addr, port: port}
	// The key's turn keeps a release by another holder of the process from
	// deleting the row between the store returning it and the hold below.
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return Reservation{}, true, err
	}
	defer refs.unlock(rk, e)
	return inStore(ctx, a, req, func(s store.Store) (Reservation, error) {
		row, err := s.Reserve(ctx, store.Request{Key: key, Label: req.Label, Kind: store.Static, Probe: probeKey})
		if err != nil {
			return Reservation{}, err
		}
		r := Reservation{Protocol: req.Protocol, Addr: row.Addr, Port: row.Port, Label: row.Label, Backend: BackendStateStore}
		refs.add(e, a, via)
		if !a.hold(r) {
			if _, left := refs.drop(e, a, via); left == 0 {
				_ = s.Release(context.WithoutCancel(ctx), key, store.Owner{}) // reaping covers a failure
			}
			return Reservation{}, ErrClosed
		}
		return r, nil
	})
}

// reserveMRU reserves a port without the state store: it refuses a port
// the store holds for a live process while the database can be read, and
// one that cannot be bound.
func (a *Allocator) reserveMRU(ctx context.Context, req Request, port uint16) (Reservation, error) {
	held, readable, err := a.readHeld(ctx)
	if err != nil {
		return Reservation{}, err
	}
	key := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: port}
	if holders := held.Holders(key); len(holders) > 0 {
		self, _ := statestore.Self() // without it no holder is this process
		for _, h := range holders {
			if h.Owner.Alive(ctx) {
				return Reservation{}, &ConflictError{Key: key, Holder: h, Self: h.Owner.Same(self)}
			}
		}
	}
	free, err := probe.Available(string(req.Protocol), req.Addr, port)
	if err != nil {
		return Reservation{}, a.probeErr(err, req)
	}
	if !free {
		a.ctr.mruProbeFailures.Add(1)
		return Reservation{}, &ConflictError{Key: key}
	}
	if err := a.mru.Record(ctx, string(req.Protocol), port); err != nil {
		a.log.Error(err, "could not record a reserved port in the MRU file", "port", port)
	}
	return a.holdMRU(req, port, readable)
}
