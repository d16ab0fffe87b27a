package store

import (
	"context"
	"net/netip"
	"time"
)

// Store is what berth's dispatcher asks of a store of reservations. package
// statestore (SQLite, one host) and package pgstore (PostgreSQL, the hosts
// of a fleet) implement it; package storetest holds the suite that proves
// an implementation keeps its promises:
//
//   - no two live owners ever hold conflicting keys (the package doc's
//     conflict rule);
//   - a reservation is made only if its probe, when given, passes inside
//     the write that records it, before any other owner can be granted the
//     key;
//   - rows of owners that have exited, and of holders whose lease has
//     ended, are deleted when they stand in the way, by Reap, and in the
//     background;
//   - Release and Transfer act only on a row the named owner holds.
//
// Errors wrap this package's sentinels. An implementation is safe for
// concurrent use.
type Store interface {
	// Reserve reserves req.Key for req.Owner. When that owner holds
	// exactly req.Key already, its row is returned and no probe runs (a
	// holder's lease starts over). A live conflict is a *ConflictError.
	Reserve(ctx context.Context, req Request) (Reservation, error)
	// Scan reserves the first of req's candidates that is free and passes
	// the probe, or returns an error wrapping ErrExhausted.
	Scan(ctx context.Context, req ScanRequest) (Reservation, error)
	// ScanBlock reserves n consecutive ports (1 to MaxBlock) from the first
	// base among req's candidates for which all n are free and pass the
	// probe: all of them or none.
	ScanBlock(ctx context.Context, req ScanRequest, n int) ([]Reservation, error)
	// Release deletes own's reservation of key (zero own: this process);
	// an error wrapping ErrNotFound when own holds no such row.
	Release(ctx context.Context, key Key, own Owner) error
	// Transfer gives from's reservation of key to to, a live process.
	Transfer(ctx context.Context, key Key, from, to Owner) error
	// List returns the reservations that match f, ordered by protocol,
	// port and address, rows of exited owners included until they are
	// reaped.
	List(ctx context.Context, f Filter) ([]Reservation, error)
	// Reap deletes the rows of owners that have exited and of holders
	// whose lease has ended, and returns how many.
	Reap(ctx context.Context) (int, error)
	// Renew starts the lease of every live reservation of holder over, at
	// ttl from now, and returns how many there are; none is an error
	// wrapping ErrNotFound (an ended lease is never revived: its port may
	// be another's by now).
	Renew(ctx context.Context, holder string, ttl time.Duration) (int, error)
	// Recall returns the port last remembered for label and p.
	Recall(ctx context.Context, label string, p Protocol) (uint16, bool, error)
	// Remember records port as the one last handed out for label and p,
	// for at most MaxSticky pairs.
	Remember(ctx context.Context, label string, p Protocol, port uint16) error
	// Check tells, cheaply, whether reservations recorded through this
	// store may have gone missing since it last said so: an error wrapping
	// ErrLost (the store's file was deleted, replaced or truncated, or a
	// failover lost commits). The holders then put back what they hold.
	// nil says nothing was lost; another error that the check could not be
	// made.
	Check(ctx context.Context) error
	// Stats returns the store's counters since it was opened.
	Stats() Stats
	// Close releases the store's resources, not its reservations.
	Close() error
}

// Request asks Reserve for one key.
type Request struct {
	Key
	// Owner is who the reservation belongs to; zero: this process.
	Owner Owner
	Label string
	// Kind is recorded with the row; zero: Static.
	Kind Kind
	// TTL is the lease of a named holder's reservation (Owner.Holder), from
	// MinTTL to MaxTTL; it must be zero for a process.
	TTL time.Duration
	// Probe, when not nil, runs inside the write that records the
	// reservation, once no live reservation stands in the way: an error
	// wrapping ErrHeld (a *ConflictError) says the port is not free, any
	// other error fails the call.
	Probe func(Key) error
	// Restore says that Owner held Key before the store lost its row (a
	// failover to a standby that had not received it): the holder puts
	// its reservation back. A store that pauses grants after a change of
	// its server (ErrGrace) accepts such a request all the same; every
	// other store treats it as any request. Only a holder that held the
	// key sets it: portalloc does, when it puts back what it holds.
	Restore bool
}

// ScanRequest asks Scan and ScanBlock for the first free port among
// candidates.
type ScanRequest struct {
	Protocol Protocol
	Addr     netip.Addr
	// Owner is who the reservation belongs to; zero: this process.
	Owner Owner
	Label string
	// Kind is recorded with the row; zero: Dynamic.
	Kind Kind
	// TTL is as Request's.
	TTL time.Duration
	// Next yields the candidate ports in the order to try them, and false
	// when there are no more.
	Next func() (port uint16, ok bool)
	// Probe is as Request's: a candidate it refuses with ErrHeld is passed
	// over.
	Probe func(Key) error
	// Batch is how many candidates one write transaction checks before it
	// commits and lets other processes in; zero: 32. Candidates a store
	// knows held without a query do not count.
	Batch int
}

// Filter selects rows for List. Zero fields match everything.
type Filter struct {
	Protocol Protocol
	Port     uint16
	Label    string
	// OwnerPID selects the rows of processes with this pid.
	OwnerPID int
	// Holder selects the rows of this named holder.
	Holder string
}

// Stats are counters of one store since it was opened.
type Stats struct {
	Reaped        int64 // rows of exited owners and ended leases deleted
	ProbeFailures int64 // candidates free in the store that the probe refused
	// LostRows are rows of this host that another host deleted (a fleet's
	// store, after this host's lease lapsed or it was retired), counted when
	// this host renewed its lease or opened the store. A store of one host
	// reports 0.
	LostRows int64
}
