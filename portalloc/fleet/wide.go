package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/seam"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// core is what the fleet-wide calls reach of an Allocator beyond its
// exported methods: its fleet store.
var core = seam.Get[*portalloc.Allocator, portalloc.Reservation, portalloc.Request, portalloc.Config]()

// Band is a range of ports, First to Last inclusive, that fleet-wide
// reservations are drawn from: store.Range, as portalloc.Range is.
type Band = store.Range

// FleetRequest asks Reserve for a port that is free on every host of
// the fleet, held by a named holder under a lease. Protocol, Band and
// Holder are required; a zero Addr is 0.0.0.0 (the port on every
// address), a zero TTL DefaultFleetTTL. It is the type package store
// declares, under this name: see store.FleetRequest for every field.
type FleetRequest = store.FleetRequest

// FleetReservation is a reservation held under a lease: its Key, Holder
// and Label, the Host it was narrowed to ("" while it is fleet-wide), and
// when its lease Expires by the PostgreSQL server's clock. It is the type
// package store declares, under this name.
type FleetReservation = store.FleetReservation

// DefaultFleetTTL is the lease of a fleet-wide reservation whose request
// has no TTL.
const DefaultFleetTTL = store.DefaultFleetTTL

// FleetSetRequest asks ReserveSet for every port of a SetSpec,
// fleet-wide, for one holder.
type FleetSetRequest struct {
	// Spec names the ports, as for portset.Allocate: a group-scoped port is
	// one reservation, a member-scoped one one per member, each labelled
	// "<set>/<group>/<member>/<port>" or "<set>/<group>/<port>". A port's
	// zero Addr is 0.0.0.0 here (the port on every address), and a
	// fixed Port is reserved as it is, wherever it lies. Prefer, Order
	// and Sticky choose among a host's range and are refused; Env and
	// Refs are validated but not used (no environment is made). Required.
	Spec portset.SetSpec
	// Band is where the ports that are not fixed are drawn from; required.
	Band Band
	// Holder names the owner of every port of the set, e.g.
	// "pod/default/web-0"; required.
	Holder string
	// TTL is the lease of every port of the set; zero: DefaultFleetTTL.
	TTL time.Duration
}

// Reserve reserves for req.Holder, under a lease of req.TTL on the
// PostgreSQL server's clock, a port of req.Band that is free on every host
// of the fleet, for an owner whose host is not known yet (a pod not yet
// scheduled) or that is not a process (a pod, a job): no process of any
// host is granted the port while the reservation lasts; one that asks gets
// a *portalloc.ConflictError naming the lease. The search starts at a random port
// of the band, so controllers reserving at once rarely want the same one.
//
// The reservation lasts until Release, or until its lease runs out
// unless Renew extends it (renew every third of the TTL or so);
// Narrow gives it its host once that is known. It is the holder's,
// not this process's: Close does not release it, and any Allocator of any
// host of the fleet can renew, narrow or release it by the holder's name.
//
// It needs a portalloc.Config.StoreDSN: on the SQLite store it returns a *portalloc.FieldError
// for portalloc.Config.StoreDSN (wrapping portalloc.ErrInvalidRequest). A band with no port free
// on every host is an error wrapping portalloc.ErrRangeExhausted; a refused field of
// req a *portalloc.FieldError naming it as package store names the fields
// of its requests ("holder", "band", "ttl", "label", "address",
// "protocol"); a store that failed or did not answer an error wrapping
// portalloc.ErrStoreUnavailable.
func Reserve(ctx context.Context, a *portalloc.Allocator, req FleetRequest) (FleetReservation, error) {
	return onFleet(ctx, a, "reserve fleet-wide", func(ctx context.Context, fs store.FleetStore) (FleetReservation, error) {
		return fs.ReserveFleet(ctx, req)
	})
}

// ReserveSet reserves every port of req.Spec fleet-wide for
// req.Holder, all of them or none: the ports are granted in one
// transaction of the fleet's store, and when one cannot be had (its band
// is exhausted) none is left reserved. Concurrent sets, from any host,
// never share a port. It returns the reservations in spec order (groups,
// then each group's ports, a member-scoped port once per member), each
// labelled as FleetSetRequest.Spec says. Renew, narrow and release them
// one by one, as Reserve's.
//
// A spec that is not valid, or that asks for what a fleet-wide set does
// not do, is a *portalloc.FieldError for "SetSpec" (see
// portset.ParseSetSpec), checked before anything else (a closed
// Allocator, or one without a fleet store, reports the spec first); the
// other errors are Reserve's: req.Band, req.Holder and req.TTL are
// refused as the "band", "holder" and "ttl" of each port's request.
func ReserveSet(ctx context.Context, a *portalloc.Allocator, req FleetSetRequest) ([]FleetReservation, error) {
	op := fmt.Sprintf("reserve fleet-wide set %s", portrange.Quote(req.Spec.Name))
	reqs, err := req.Spec.FleetRequests(req.Band, req.Holder, req.TTL)
	if err != nil {
		return nil, opError(op, err)
	}
	return onFleet(ctx, a, op, func(ctx context.Context, fs store.FleetStore) ([]FleetReservation, error) {
		return fs.ReserveFleetSet(ctx, reqs)
	})
}

// Renew extends r's lease to ttl from now by the server's clock
// (zero: DefaultFleetTTL), checked against r.Holder: r's Key and Holder
// are what count, as Reserve or Leases returned them. A
// reservation that is gone (released, or lapsed and reaped), or that is
// another holder's, is an error wrapping portalloc.ErrNotHeld: its port may be
// someone else's now; reserve again.
func Renew(ctx context.Context, a *portalloc.Allocator, r FleetReservation, ttl time.Duration) error {
	_, err := onFleet(ctx, a, "renew fleet-wide", func(ctx context.Context, fs store.FleetStore) (struct{}, error) {
		return struct{}{}, fs.RenewFleet(ctx, r.Key, r.Holder, ttl)
	})
	return err
}

// Release deletes r's reservation, fleet-wide or narrowed, checked
// against r.Holder: the release path of the holder's controller, e.g. a
// pod's finalizer. Another holder's reservation is never touched. One
// that is gone, or another holder's, is an error wrapping portalloc.ErrNotHeld.
func Release(ctx context.Context, a *portalloc.Allocator, r FleetReservation) error {
	_, err := onFleet(ctx, a, "release fleet-wide", func(ctx context.Context, fs store.FleetStore) (struct{}, error) {
		return struct{}{}, fs.ReleaseFleet(ctx, r.Key, r.Holder)
	})
	return err
}

// Narrow makes r's fleet-wide reservation one of host (a name as
// portalloc.Config.Host takes it), e.g. once its pod is bound to a node: the port
// is free again on every other host and stays r.Holder's on host, under
// its lease. Narrowing to the host it is on already does nothing; one
// narrowed to another host is a *portalloc.FieldError for "host" (release it and
// reserve again). A host no berth has run on yet is registered by the
// name: check it, a misspelt one holds the port on a host that does not
// exist. One that is gone, or another holder's, is an error wrapping
// portalloc.ErrNotHeld.
func Narrow(ctx context.Context, a *portalloc.Allocator, r FleetReservation, host string) error {
	_, err := onFleet(ctx, a, "narrow fleet-wide", func(ctx context.Context, fs store.FleetStore) (struct{}, error) {
		return struct{}{}, fs.NarrowFleet(ctx, r.Key, r.Holder, host)
	})
	return err
}

// Leases returns every reservation of the fleet held under a lease,
// fleet-wide or narrowed to a host, ordered by holder, protocol, port and
// address: how a controller that restarted finds what its holders hold.
// Leases that ran out are included until reaped; their Expires, by the
// server's clock, says so.
func Leases(ctx context.Context, a *portalloc.Allocator) ([]FleetReservation, error) {
	return onFleet(ctx, a, "list fleet-wide", func(ctx context.Context, fs store.FleetStore) ([]FleetReservation, error) {
		return fs.Leases(ctx)
	})
}

// onFleet runs call on a's fleet store within a's portalloc.Config.Timeout and puts
// its error in portalloc's words (see package seam), with the prefix for
// op once.
func onFleet[T any](ctx context.Context, a *portalloc.Allocator, op string, call func(context.Context, store.FleetStore) (T, error)) (T, error) {
	var v T
	err := core.OnFleet(ctx, a, func(ctx context.Context, fs store.FleetStore) error {
		var err error
		v, err = call(ctx, fs)
		return err
	})
	if err != nil {
		var zero T
		return zero, opError(op, err)
	}
	return v, nil
}

// opError is the error of a public call of the package: err in a
// *portalloc.OpError, the one place the package's calls add the prefix.
// Its Op is op for refused input and a closed Allocator, and empty for an
// error of the store, whose message says what it did ("renew the lease
// of ... on tcp 0.0.0.0:40000: no such reservation"). An error of a
// public call of package portset (an *OpError already) gets op instead of
// its own prefix. nil stays nil.
func opError(op string, err error) error {
	if err == nil {
		return nil
	}
	var (
		oe *portalloc.OpError
		fe *portalloc.FieldError
	)
	if errors.As(err, &oe) {
		err = oe.Err // the spec's, from portset: one prefix
	}
	if !errors.As(err, &fe) && !errors.Is(err, portalloc.ErrClosed) {
		op = ""
	}
	return &portalloc.OpError{Op: op, Err: err}
}
