package portalloc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/portalloc/internal/scopes"
	"github.com/berth-go/berth/store"
)

// errHolderNotFound is wrapped by the errors of renew and releaseHolder
// when the holder holds no reservation they can act on; package lease
// exports it as ErrHolderNotFound.
var errHolderNotFound = errors.New("holder holds no such reservation")

// allocateLease is lease.Allocate.
func (a *Allocator) allocateLease(ctx context.Context, req Request, l store.Lease) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	defer func() { err = opError("allocate", err) }()
	if req.Sticky && req.Label == "" {
		return Reservation{}, &FieldError{Field: "Request.Label", Value: "", Want: "a label to remember the port under, which a sticky request (Request.Sticky) needs"}
	}
	return a.lease(ctx, req, l, func(ctx context.Context, s store.Store, ls store.LeaseStore, req Request) (store.Reservation, error) {
		next, sticky := a.candidates(ctx, s, req, a.set)
		row, err := ls.ScanLease(ctx, store.ScanRequest{
			Protocol: req.Protocol,
			Addr:     req.Addr,
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
	defer func() { err = opError("reserve", err) }()
	if port == 0 {
		return Reservation{}, &FieldError{Field: "port", Value: "0", Want: "a port from 1 to 65535 (lease.Allocate chooses a free one)"}
	}
	return a.lease(ctx, req, l, func(ctx context.Context, _ store.Store, ls store.LeaseStore, req Request) (store.Reservation, error) {
		key := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: port}
		return ls.ReserveLease(ctx, store.Request{Key: key, Label: req.Label, Kind: store.Static, Probe: probeKey}, l)
	})
}

// lease runs op for a lease request on the Allocator's lease store.
func (a *Allocator) lease(ctx context.Context, req Request, l store.Lease, op func(context.Context, store.Store, store.LeaseStore, Request) (store.Reservation, error)) (Reservation, error) {
	if err := l.Validate(); err != nil {
		return Reservation{}, err
	}
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	what := fmt.Sprintf("lease a %s port on %s for holder %q", req.Protocol, req.Addr, l.Holder)
	row, err := inLeaseStore(ctx, a, func(s store.Store, ls store.LeaseStore) (store.Reservation, error) {
		return op(ctx, s, ls, req)
	})
	if err != nil {
		var ce *ConflictError
		switch {
		case errors.As(err, &ce):
			return Reservation{}, ce
		case errors.Is(err, store.ErrExhausted):
			return Reservation{}, fmt.Errorf("%s in %s: %w", what, a.cfg.Range, ErrRangeExhausted)
		}
		return Reservation{}, fmt.Errorf("%s: %w", what, a.leaseErr(err))
	}
	r := Reservation{Protocol: req.Protocol, Addr: row.Addr, Port: row.Port, Label: row.Label,
		Backend: BackendStateStore, Holder: l.Holder, Expires: row.Expires}
	a.log.V(1).Info("leased port", "protocol", string(r.Protocol), "address", r.Addr.String(), "port", r.Port, "holder", r.Holder, "ttl", l.TTL.String())
	return r, nil
}

// renew is lease.Renew. Its errors have no prefix: the public call adds it.
func (a *Allocator) renew(ctx context.Context, holder string, ttl time.Duration) (int, error) {
	if err := (store.Lease{Holder: holder, TTL: ttl}).Validate(); err != nil {
		return 0, err
	}
	n, err := inLeaseStore(ctx, a, func(_ store.Store, ls store.LeaseStore) (int, error) {
		return ls.RenewLease(ctx, holder, ttl)
	})
	if err != nil {
		return 0, a.leaseErr(err)
	}
	return n, nil
}

// releaseHolderOp is the operation prefix of lease.Release's errors, and
// of Release's of a reservation under a lease.
func releaseHolderOp(holder string) string {
	return "release the reservations of holder " + quoteHolder(holder)
}

// quoteHolder quotes a holder's name for an operation prefix, cut after
// 64 bytes as a refused value is.
func quoteHolder(holder string) string { return portrange.Quote(holder) }

// releaseHolder is lease.Release under the release's context, without
// the operation prefix.
func (a *Allocator) releaseHolder(ctx context.Context, holder string, f store.Filter) (int, error) {
	if err := store.CheckHolder(holder); err != nil {
		return 0, err
	}
	if f.Label != "" {
		if err := checkLabel(f.Label); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				named := *fe
				named.Field = "Filter.Label"
				return 0, &named
			}
			return 0, err
		}
	}
	n, err := inLeaseStore(ctx, a, func(_ store.Store, ls store.LeaseStore) (int, error) {
		return ls.ReleaseLease(ctx, holder, store.Filter{Protocol: f.Protocol, Port: f.Port, Label: scopes.Label(a.cfg.Scope, f.Label)})
	})
	if err != nil {
		return 0, a.leaseErr(err)
	}
	return n, nil
}

// inLeaseStore runs op on the Allocator's state store as a lease store,
// with the store's repair (see repair) held off while it runs, and once
// more when the store was lost or replaced under op: a lease call meets a
// store whose file was deleted as every other call does, on the store
// opened again. A lease never falls back. The errors of leaseStore are
// returned as they are, those of op untranslated.
func inLeaseStore[T any](ctx context.Context, a *Allocator, op func(store.Store, store.LeaseStore) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		s, ls, err := a.leaseStore(ctx)
		if err != nil {
			var zero T
			return zero, err
		}
		v, again, err := runOn(ctx, a, s, attempt, func(s store.Store) (T, error) { return op(s, ls) })
		if !again {
			return v, err
		}
	}
}

// leaseStore returns the Allocator's state store as a lease store, or an
// error wrapping ErrStoreUnavailable when it has none.
func (a *Allocator) leaseStore(ctx context.Context) (store.Store, store.LeaseStore, error) {
	if a.isClosed() {
		return nil, nil, ErrClosed
	}
	a.retryStore(ctx)
	s := a.db()
	if s == nil {
		cause := "the Allocator serves from the MRU file"
		if err := a.FallbackCause(); err != nil {
			cause += " (" + err.Error() + ")"
		}
		return nil, nil, fmt.Errorf("%w: a lease needs the state store, and %s", ErrStoreUnavailable, cause)
	}
	ls, ok := s.(store.LeaseStore)
	if !ok {
		return nil, nil, fmt.Errorf("%w: the store %T keeps no leases of one host", ErrStoreUnavailable, s)
	}
	return s, ls, nil
}

// leaseErr translates an error of a lease call of the store. A lease never
// falls back: the MRU file cannot keep one. The caller says what the call
// was.
func (a *Allocator) leaseErr(err error) error {
	err = a.closedErr(err)
	switch {
	case errors.Is(err, ErrClosed):
		return ErrClosed
	case errors.Is(err, ErrStoreUnavailable):
		return err // leaseStore's: there is no store to ask
	case errors.Is(err, store.ErrNotFound):
		// The store's message repeats the operation; what it says is all
		// in ErrHolderNotFound.
		return fmt.Errorf("%w (none was made, it was released, or its lease has ended; an ended lease is not renewed: get the ports again)", errHolderNotFound)
	case errors.Is(err, store.ErrInvalid):
		return err
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, ErrTransient), transient.Is(err) && errors.Is(err, store.ErrStorage):
		return transientErr(err) // the store's own shortage
	case transient.Is(err):
		// The bind probe's shortage (out of descriptors, say): it wraps
		// ErrTransient, as every shortage does, and says nothing about
		// the store.
		if short := transient.Wrap(err); short != nil {
			err = short
		}
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}
