package portalloc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/store"
)

// errHolderNotFound is wrapped by the errors of renew and releaseHolder
// when the holder holds no reservation they can act on; package lease
// exports it as ErrHolderNotFound.
var errHolderNotFound = errors.New("holder holds no such reservation")

// allocateLease is lease.Allocate.
func (a *Allocator) allocateLease(ctx context.Context, req Request, l store.Lease) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	if req.Sticky && req.Label == "" {
		return Reservation{}, fmt.Errorf("%w: a sticky request needs a Label to remember its port under", ErrInvalidRequest)
	}
	return a.lease(ctx, req, l, func(ctx context.Context, s store.Store, ls store.LeaseStore, req Request) (store.Reservation, error) {
		next, sticky := a.candidates(ctx, s, req, a.set)
		row, err := ls.ScanLease(ctx, store.ScanRequest{
			Protocol: req.Protocol,
			Addr:     req.Address,
			Label:    req.Label,
			Next:     next,
			Probe:    probeKey,
		}, l)
		if err == nil {
			a.remember(ctx, s, req, sticky, row.Port)
		}
		return row, err
	})
}

// reserveLease is lease.Reserve.
func (a *Allocator) reserveLease(ctx context.Context, req Request, port uint16, l store.Lease) (r Reservation, err error) {
	defer func() { a.ctr.count(true, err) }()
	if port == 0 {
		return Reservation{}, fmt.Errorf("%w: port 0: want a port from 1 to 65535 (use lease.Allocate for any free port)", ErrInvalidRequest)
	}
	return a.lease(ctx, req, l, func(ctx context.Context, _ store.Store, ls store.LeaseStore, req Request) (store.Reservation, error) {
		key := store.Key{Protocol: req.Protocol, Addr: req.Address, Port: port}
		return ls.ReserveLease(ctx, store.Request{Key: key, Label: req.Label, Kind: store.Static, Probe: probeKey}, l)
	})
}

// lease runs op for a lease request on the Allocator's lease store.
func (a *Allocator) lease(ctx context.Context, req Request, l store.Lease, op func(context.Context, store.Store, store.LeaseStore, Request) (store.Reservation, error)) (Reservation, error) {
	if err := l.Check(); err != nil {
		return Reservation{}, fmt.Errorf("portalloc: %w", err)
	}
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	what := fmt.Sprintf("lease a %s port on %s for holder %q", req.Protocol, req.Address, l.Holder)
	s, ls, err := a.leaseStore(ctx, what)
	if err != nil {
		return Reservation{}, err
	}
	row, err := op(ctx, s, ls, req)
	if err != nil {
		var ce *ConflictError
		switch {
		case errors.As(err, &ce):
			return Reservation{}, ce
		case errors.Is(err, store.ErrExhausted):
			return Reservation{}, fmt.Errorf("portalloc: %s in %s: %w", what, a.cfg.Range, ErrRangeExhausted)
		}
		return Reservation{}, a.leaseErr(what, err)
	}
	r := Reservation{Protocol: req.Protocol, Address: row.Addr, Port: row.Port, Label: row.Label,
		Backend: BackendStateStore, Holder: l.Holder, Expires: row.Expires}
	a.log.V(1).Info("leased port", "protocol", string(r.Protocol), "address", r.Address.String(), "port", r.Port, "holder", r.Holder, "ttl", l.TTL.String())
	return r, nil
}

// renew is lease.Renew.
func (a *Allocator) renew(ctx context.Context, holder string, ttl time.Duration) (int, error) {
	what := fmt.Sprintf("renew the leases of holder %q", holder)
	if err := (store.Lease{Holder: holder, TTL: ttl}).Check(); err != nil {
		return 0, fmt.Errorf("portalloc: %s: %w", what, err)
	}
	_, ls, err := a.leaseStore(ctx, what)
	if err != nil {
		return 0, err
	}
	n, err := ls.RenewLease(ctx, holder, ttl)
	if err != nil {
		return 0, a.leaseErr(what, err)
	}
	return n, nil
}

// releaseHolder is lease.Release.
func (a *Allocator) releaseHolder(ctx context.Context, holder string, f store.Filter) (int, error) {
	ctx, cancel := a.releaseContext(ctx)
	defer cancel()
	what := fmt.Sprintf("release the reservations of holder %q", holder)
	if err := store.CheckHolder(holder); err != nil {
		return 0, fmt.Errorf("portalloc: %s: %w", what, err)
	}
	if f.Label != "" {
		if err := checkLabel(f.Label); err != nil {
			return 0, err
		}
	}
	_, ls, err := a.leaseStore(ctx, what)
	if err != nil {
		return 0, err
	}
	n, err := ls.ReleaseLease(ctx, holder, f)
	if err != nil {
		return 0, a.leaseErr(what, err)
	}
	return n, nil
}

// leaseStore returns the Allocator's state store as a lease store, or an
// error wrapping ErrStoreUnavailable when it has none.
func (a *Allocator) leaseStore(ctx context.Context, what string) (store.Store, store.LeaseStore, error) {
	if a.isClosed() {
		return nil, nil, fmt.Errorf("portalloc: %s: %w", what, ErrClosed)
	}
	a.retryStore(ctx)
	s := a.db()
	if s == nil {
		cause := "the Allocator serves from the MRU file"
		if err := a.FallbackCause(); err != nil {
			cause += " (" + err.Error() + ")"
		}
		return nil, nil, fmt.Errorf("portalloc: %s: %w: a lease needs the state store, and %s", what, ErrStoreUnavailable, cause)
	}
	ls, ok := s.(store.LeaseStore)
	if !ok {
		return nil, nil, fmt.Errorf("portalloc: %s: %w: the store %T keeps no leases of one host", what, ErrStoreUnavailable, s)
	}
	return s, ls, nil
}

// leaseErr translates an error of a lease call of the store. A lease never
// falls back: the MRU file cannot keep one.
func (a *Allocator) leaseErr(what string, err error) error {
	err = a.closedErr(err)
	switch {
	case errors.Is(err, ErrClosed):
		return fmt.Errorf("portalloc: %s: %w", what, ErrClosed)
	case errors.Is(err, store.ErrNotFound):
		// The store's message repeats the operation; what it says is all
		// in ErrHolderNotFound.
		return fmt.Errorf("portalloc: %s: %w (none was made, it was released, or its lease has ended; an ended lease is not renewed: get the ports again)", what, errHolderNotFound)
	case errors.Is(err, store.ErrInvalid):
		return fmt.Errorf("portalloc: %s: %w", what, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("portalloc: %s: %w", what, err)
	case errors.Is(err, ErrTransient), transient.Is(err) && errors.Is(err, store.ErrStorage):
		return fmt.Errorf("portalloc: %s: %w", what, transientErr(err)) // the store's own shortage
	case transient.Is(err):
		// The bind probe's shortage (out of descriptors, say): it wraps
		// ErrTransient, as every shortage does, and says nothing about
		// the store.
		if short := transient.Wrap(err); short != nil {
			err = short
		}
		return fmt.Errorf("portalloc: %s: %w", what, err)
	}
	return fmt.Errorf("portalloc: %s: %w: %w", what, ErrStoreUnavailable, err)
}
