// Package lease reserves ports for named holders under a lease, on one
// host: ports that belong to no process, so they outlive the program that
// asked for them (a CI job's port, a development environment that a shell
// script starts). A lease lasts until Release releases its ports or its
// TTL runs out without a Renew, by a clock no wall-clock step moves, or
// until the next boot.
//
// Leases are kept by the Allocator's state store (package portalloc), in
// its store.LeaseStore; the Allocator does not hold them, and its Close
// leaves them. A Reservation made under a lease has Holder and Expires
// set, and the Allocator's Release releases it for its holder.
package lease

import (
	"context"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/seam"
	"github.com/berth-go/berth/store"
)

// core is what the leases reach of an Allocator beyond its exported
// methods: its lease store.
var core = seam.Get[*portalloc.Allocator, portalloc.Reservation, portalloc.Request, portalloc.Config]()

// Lease names the holder of a reservation that belongs to no process, and
// how long it lasts: see Allocate. Holder is 1 to store.MaxHolderLen
// bytes of printable UTF-8 (e.g. "ci/job-4711"); TTL is from
// store.MinLeaseTTL (1s) to store.MaxLeaseTTL (720h, 30 days).
type Lease = store.Lease

// Filter selects which reservations of a holder Release
// releases. The zero Filter selects all of them.
type Filter struct {
	Protocol portalloc.Protocol // zero: either
	Port     uint16             // zero: any
	Label    string             // zero: any
}

// ErrHolderNotFound is wrapped by the errors of Renew and Release
// when the holder holds no reservation they can act on: none was made,
// it was released, or (for Renew) its lease has ended. An ended lease is
// never renewed: another owner may have its port by now.
var ErrHolderNotFound = core.ErrHolderNotFound

// Allocate is a's Allocate for a named holder: the port belongs to
// l.Holder under a lease of l.TTL instead of to this process, so it
// outlives the process that asked (a CI job's port, a development
// environment that a shell script starts). It lasts until Release
// releases it or its lease ends: l.TTL after the grant or the last Renew,
// by a clock no wall-clock step moves (see the statestore package), or at
// the next boot. The Allocator does not hold it: its Close leaves it.
//
// Leases need the state store: in the MRU mode, or while the Allocator
// has fallen back to the MRU file, Allocate returns an error wrapping
// portalloc.ErrStoreUnavailable and never falls back. The returned Reservation has
// Holder and Expires set.
func Allocate(ctx context.Context, a *portalloc.Allocator, req portalloc.Request, l Lease) (portalloc.Reservation, error) {
	return core.AllocateLease(ctx, a, req, l)
}

// Reserve is a's Reserve for a named holder (see Allocate): port,
// whether or not it lies in the range, for l.Holder under a lease of
// l.TTL. When the holder holds exactly this port already, its lease starts
// over with l.TTL.
func Reserve(ctx context.Context, a *portalloc.Allocator, req portalloc.Request, port uint16, l Lease) (portalloc.Reservation, error) {
	return core.ReserveLease(ctx, a, req, port, l)
}

// Renew sets the lease of every reservation of holder whose lease has not
// ended to ttl from now, and returns how many there are. A holder with
// none (never made, released, or every lease ended) is an error wrapping
// ErrHolderNotFound: an ended lease is never revived.
func Renew(ctx context.Context, a *portalloc.Allocator, holder string, ttl time.Duration) (int, error) {
	return core.Renew(ctx, a, holder, ttl)
}

// Release releases the reservations of holder that f selects (the
// zero Filter: all of them) and returns how many; none is an error
// wrapping ErrHolderNotFound. Like the Allocator's Release, it goes on when ctx is
// cancelled, within a deadline of its own of portalloc.Config.Timeout.
func Release(ctx context.Context, a *portalloc.Allocator, holder string, f Filter) (int, error) {
	return core.ReleaseHolder(ctx, a, holder, store.Filter{Protocol: f.Protocol, Port: f.Port, Label: f.Label})
}
