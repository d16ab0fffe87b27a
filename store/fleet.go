package store

import (
	"context"
	"net/netip"
	"time"
)

// Fleet-wide reservations: ports held by a named holder under a renewable
// lease, on every host of a fleet that shares one store, rather than by a
// process of one host. A store of a fleet (pgstore.Store) offers them as a
// FleetStore; the dispatcher reaches it by a type assertion on its Store,
// as it reaches a LeaseStore, and a store of one host has none.

// DefaultFleetTTL is the lease of a fleet-wide reservation when the
// request's TTL is zero.
const DefaultFleetTTL = 5 * time.Minute

// MaxFleetSet is the most ports one ReserveFleetSet reserves.
const MaxFleetSet = 1024

// FleetRequest asks ReserveFleet for a port. Every zero value is
// documented; Holder and Band are required.
type FleetRequest struct {
	// Protocol is tcp or udp; required.
	Protocol Protocol
	// Addr is the address the holder will bind; zero: 0.0.0.0, which
	// under berth's conflict rule takes the port on every address, IPv4
	// and IPv6: "this port on whatever host, whatever address", the usual
	// meaning of a fleet-wide port.
	Addr netip.Addr
	// Band is where the port is drawn from, from a random port of it
	// onwards (see ReserveFleet): a band of the caller's own for
	// fleet-wide ports, apart from the ranges hosts hand out to processes,
	// so that per-host grants rarely stand in the way (a port any host
	// holds is skipped). Required.
	Band Range
	// Holder names the owner, e.g. "pod/default/web-0": at most 255
	// bytes, no control characters. Required.
	Holder string
	// Label is stored with the row, as Request's.
	Label string
	// TTL is how long the lease lasts from the grant, by the store's
	// clock; zero: DefaultFleetTTL. RenewFleet extends it.
	TTL time.Duration
}

// FleetReservation is a reservation held under a lease.
type FleetReservation struct {
	Key
	Holder string
	Label  string
	// Host is the host it was narrowed to; "" while it is fleet-wide.
	Host string
	// Expires is when the lease runs out, by the store's clock (the
	// PostgreSQL server's): compare it with the server's time, not the
	// local clock.
	Expires time.Time
	Created time.Time
}

// FleetStore is a Store shared by the hosts of a fleet (pgstore.Store):
// what the dispatcher, portalloc, asks of it beyond Store. Its losses are
// of rows, not of the store itself: Check (store.Checker) reports, with an
// error wrapping ErrLost, that rows of this process may be missing (after
// a failover to a standby that had not received them, say); the holders
// compare what they hold with List, put back what is missing, and call
// Checked. The store is not reopened.
type FleetStore interface {
	Store
	Checker
	// Checked tells the store that its holders have compared their
	// reservations with it after err, an error of Check, and put back
	// what was missing: Check returns nil until there is a new reason to
	// compare. Any other err is ignored.
	Checked(err error)
	// ReserveFleet reserves for req.Holder, under a lease of req.TTL, a
	// port of req.Band that is free on every host. A band with no port
	// free everywhere is an error wrapping ErrExhausted; a refused field
	// a *FieldError naming it ("holder", "band", "ttl", ...).
	ReserveFleet(ctx context.Context, req FleetRequest) (FleetReservation, error)
	// ReserveFleetSet reserves a port for each of reqs (one holder, at
	// most MaxFleetSet of them), all of them or none, in one transaction.
	ReserveFleetSet(ctx context.Context, reqs []FleetRequest) ([]FleetReservation, error)
	// RenewFleet extends holder's lease of key to ttl from now (zero:
	// DefaultFleetTTL); a reservation that is gone or another holder's is
	// an error wrapping ErrNotFound.
	RenewFleet(ctx context.Context, key Key, holder string, ttl time.Duration) error
	// ReleaseFleet deletes holder's reservation of key, fleet-wide or
	// narrowed; one that is gone or another holder's is an error wrapping
	// ErrNotFound.
	ReleaseFleet(ctx context.Context, key Key, holder string) error
	// NarrowFleet makes holder's fleet-wide reservation of key one of
	// host: the port is free again on every other host.
	NarrowFleet(ctx context.Context, key Key, holder, host string) error
	// Leases returns every reservation held under a lease, fleet-wide or
	// narrowed, ordered by holder, protocol, port and address.
	Leases(ctx context.Context) ([]FleetReservation, error)
}
