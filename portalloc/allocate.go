package portalloc

import (
	"context"
	"errors"
	"net/netip"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/internal/probe"
	"github.com/berth-go/berth/mru"
	"github.com/berth-go/berth/store"
)

func probeKey(k store.Key) (bool, error) {
	return probe.Available(string(k.Protocol), k.Addr, k.Port)
}

// Allocate reserves a free port of the configured range for req and returns
// it. The port has been bind-probed on req.Addr. It returns an error
// wrapping ErrRangeExhausted when no port is free, and a *FieldError
// wrapping ErrInvalidRequest for a field of req it refuses.
func (a *Allocator) Allocate(ctx context.Context, req Request) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	defer func() { err = opError("allocate", err) }()
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	if req.Sticky && req.Label == "" {
		return Reservation{}, &FieldError{Field: "Request.Label", Value: "", Want: "a label to remember the port under, which a sticky request (Request.Sticky) needs"}
	}
	return a.allocate(ctx, req, a.set, probeFunc(req), "")
}

func probeFunc(req Request) func(uint16) (bool, error) {
	return func(p uint16) (bool, error) {
		return probe.Available(string(req.Protocol), req.Addr, p)
	}
}

// allocateIn is allocate with the probe, on a set of ports of the range
// (a pool's), held by via. The caller has run begin.
func (a *Allocator) allocateIn(ctx context.Context, req Request, set *portrange.Set, via string) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	return a.allocate(ctx, req, set, probeFunc(req), via)
}

// allocate walks set for req and takes the first port that the backend has
// free and bindable passes. bindable runs inside the store's write
// transaction. via names the holder of the reference it takes (see refs).
func (a *Allocator) allocate(ctx context.Context, req Request, set *portrange.Set, bindable func(uint16) (bool, error), via string) (Reservation, error) {
	a.retryStore(ctx)
	if !a.fb.active.Load() {
		if r, done, err := a.scanStore(ctx, req, set, bindable, via); done {
			return r, err
		}
	}
	return a.allocateMRU(ctx, req, set, bindable)
}

// scanStore allocates in the state store. done is false when the store
// failed and the Allocator fell back: the MRU file is to serve.
func (a *Allocator) scanStore(ctx context.Context, req Request, set *portrange.Set, bindable func(uint16) (bool, error), via string) (Reservation, bool, error) {
	return inStore(ctx, a, req, func(s store.Store) (Reservation, error) {
		next, sticky := a.candidates(ctx, s, req, set)
		row, err := s.Scan(ctx, store.ScanRequest{
			Protocol: req.Protocol,
			Addr:     req.Addr,
			Label:    req.Label,
			Next:     next,
			Probe:    func(k store.Key) (bool, error) { return bindable(k.Port) },
		})
		if err != nil {
			return Reservation{}, err
		}
		a.remember(ctx, s, req, sticky, row.Port)
		r := Reservation{Protocol: req.Protocol, Addr: row.Addr, Port: row.Port, Label: req.Label, Backend: BackendStateStore}
		if !a.holdNew(ctx, s, r, via) {
			return Reservation{}, ErrClosed
		}
		return r, nil
	})
}

// inStore runs op on the Allocator's state store, and once more when a
// retry after a fallback replaced that store while op ran. done is false
// when there is no store or it failed and the Allocator fell back: the MRU
// file is to serve. An error of op wrapping ErrClosed (the Allocator
// closed) is returned as it is; storeErr translates the others.
func inStore[T any](ctx context.Context, a *Allocator, req Request, op func(store.Store) (T, error)) (v T, done bool, err error) {
	for attempt := 0; ; attempt++ {
		s := a.db()
		if s == nil {
			return v, false, nil
		}
		got, again, err := runOn(ctx, a, s, attempt, op)
		switch {
		case err == nil:
			return got, true, nil
		case again:
			continue
		case errors.Is(err, ErrClosed):
			return v, true, err
		}
		if err := a.storeErr(ctx, err, req); err != nil {
			return v, true, err
		}
		return v, false, nil
	}
}

// runOn runs op on s, the Allocator's store, under the repair lock (see
// repairMu). again reports that op failed because s was lost or replaced
// meanwhile, and that the Allocator now has a store to run op on again
// (see replaced); attempt counts the runs before this one, and the last
// of maxReplacements is not run again. err is op's error, or why a lost
// store could not be opened again.
func runOn[T any](ctx context.Context, a *Allocator, s store.Store, attempt int, op func(store.Store) (T, error)) (v T, again bool, err error) {
	a.repairMu.RLock()
	v, err = op(s)
	a.repairMu.RUnlock()
	if err == nil || errors.Is(err, ErrClosed) || attempt >= maxReplacements {
		return v, false, err
	}
	again, err = a.replaced(ctx, s, err)
	return v, again, err
}

// holdNew takes this Allocator's hold, on behalf of via, of a row a scan
// has just inserted: nobody else in the process can hold it yet. When the
// Allocator has closed meanwhile, it releases the row and reports false.
func (a *Allocator) holdNew(ctx context.Context, s store.Store, r Reservation, via string) bool {
	rk := a.refKeyOf(r)
	refs.addNew(rk, a, via)
	if a.hold(r) {
		return true
	}
	if refs.forget(rk, a) == 0 {
		_ = s.Release(context.WithoutCancel(ctx), storeKey(r), store.Owner{}) // reaping covers a failure
	}
	return false
}

// storeKey is r's key in the state store.
func storeKey(r Reservation) store.Key {
	return store.Key{Protocol: r.Protocol, Addr: r.Addr, Port: r.Port}
}

// allocateMRU allocates from the MRU file, skipping every port the state
// store holds (see readHeld for a store that cannot be read) and every port
// this Allocator holds itself, on either backend: after the store was
// replaced under it, the store's view lacks the Allocator's own rows.
func (a *Allocator) allocateMRU(ctx context.Context, req Request, set *portrange.Set, bindable func(uint16) (bool, error)) (Reservation, error) {
	held, readable, err := a.readHeld(ctx)
	if err != nil {
		return Reservation{}, err
	}
	own := a.ownPorts(req.Protocol)
	it, _ := a.candidates(ctx, nil, req, set) // the MRU file remembers no sticky port
	next := func() (uint16, bool) {
		for {
			p, ok := it()
			if !ok {
				return p, ok
			}
			if len(held.Holders(store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: p})) == 0 && !own.conflicts(p, req.Addr) {
				return p, ok
			}
		}
	}
	port, err := a.mru.Allocate(ctx, mru.Request{
		Protocol: string(req.Protocol),
		Addr:     req.Addr,
		Next:     next,
		Probe: func(p uint16) (bool, error) {
			free, err := bindable(p)
			if err == nil && !free {
				a.ctr.mruProbeFailures.Add(1)
			}
			return free, err
		},
	})
	if err != nil {
		return Reservation{}, a.mruErr(ctx, err, req)
	}
	return a.holdMRU(req, port, readable)
}

// holdMRU holds a port the MRU file has just handed out for req, counting
// it in Stats.Blind when the state store could not be read to skip the
// ports it holds.
func (a *Allocator) holdMRU(req Request, port uint16, readable bool) (Reservation, error) {
	if !readable {
		a.ctr.blind.Add(1)
	}
	r := Reservation{Protocol: req.Protocol, Addr: req.Addr, Port: port, Label: req.Label, Backend: BackendMRU}
	if !a.hold(r) {
		return Reservation{}, ErrClosed
	}
	return r, nil
}

// ownedPorts is the addresses an Allocator holds, by port, of one protocol.
type ownedPorts map[uint16][]netip.Addr

// ownPorts returns the ports of protocol that the Allocator holds, on any
// backend.
func (a *Allocator) ownPorts(protocol Protocol) ownedPorts {
	a.mu.Lock()
	defer a.mu.Unlock()
	own := ownedPorts{}
	for k := range a.held {
		if k.protocol == protocol {
			own[k.port] = append(own[k.port], k.addr)
		}
	}
	return own
}

// conflicts reports whether a held address of port conflicts with addr.
func (o ownedPorts) conflicts(port uint16, addr netip.Addr) bool {
	for _, h := range o[port] {
		if netaddr.Conflicts(h, addr) {
			return true
		}
	}
	return false
}
