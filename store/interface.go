package store

import (
	"context"
	"net/netip"
)

// ProbeFunc tells whether key's port can be bound right now. It runs inside
// the write transaction that records the reservation, so no other berth
// process can choose the port between the probe and the insert.
type ProbeFunc func(key Key) (bool, error)

// Request asks Reserve for one key.
type Request struct {
	Key
	// Owner is the process the reservation belongs to; zero: this process.
	Owner Owner
	Label string
	// Kind is recorded with the row; zero: Static.
	Kind Kind
	// Probe, when not nil, must report the port bindable for the
	// reservation to be made.
	Probe ProbeFunc
}

// ScanRequest asks Scan for the first free port among candidates.
type ScanRequest struct {
	Protocol Protocol
	Addr     netip.Addr
	// Owner is the process the reservation belongs to; zero: this process.
	Owner Owner
	Label string
	// Kind is recorded with the row; zero: Dynamic.
	Kind Kind
	// Next yields the candidate ports in the order to try them, and false
	// when there are no more.
	Next func() (port uint16, ok bool)
	// Probe, when not nil, must report a candidate bindable for it to be
	// taken.
	Probe ProbeFunc
	// Batch is how many candidates one write transaction checks against
	// the table before it commits and lets other processes in; zero: 32.
	// Candidates that the in-memory view shows held cost nothing and do
	// not count.
	Batch int
}

// Filter selects rows for List. Zero fields match everything.
type Filter struct {
	Protocol Protocol
	Port     uint16
	Label    string
	OwnerPID int
}

// Stats are counters of one Store since Open.
type Stats struct {
	Reaped        int64 // rows of exited owners deleted
	ProbeFailures int64 // candidates that were free in the table but bound outside berth
	// LostRows are rows of this host that another host deleted (a fleet
	// store, after this host's lease lapsed or it was retired), reported
	// when this host renewed its lease or opened the store. Their owners
	// may still use the ports, which can be handed out again. A store of
	// one host reports 0.
	LostRows int64
}

// Checker is a store that can tell cheaply, without a write, whether the
// reservations recorded through it may have been lost since it was opened:
// statestore's file deleted, replaced or truncated (the holder reopens the
// store), or pgstore's rows lost in a failover (the store stays usable; see
// pgstore.Store.Check). A holder that learns so puts back what it holds;
// portalloc's Allocator asks every CheckInterval.
type Checker interface {
	// Check returns an error wrapping ErrLost when the store must be
	// reopened, and nil while it is the store other processes use. Other
	// errors say only that the check could not be made.
	Check(ctx context.Context) error
}

// Store is what berth's dispatcher, portalloc, asks of a store of
// reservations. statestore.Store (SQLite, one host) and pgstore.Store
// (PostgreSQL, the hosts of a fleet) implement it.
//
// Every implementation keeps the same promises: no two live owners ever
// hold conflicting keys (the package doc's conflict rule); a reservation
// is made only if its probe, when given, passes before any other owner
// can be granted the key; rows of owners that have exited are deleted
// when they stand in the way, by Reap, and in the background; Release and
// Transfer act only on a row the named owner holds. Errors wrap this
// package's sentinels. An implementation is safe for concurrent use.
type Store interface {
	// Reserve reserves req.Key for req.Owner (zero: this process). When
	// that owner holds exactly req.Key already, its row is returned and no
	// probe runs. A live conflict is a *ConflictError.
	Reserve(ctx context.Context, req Request) (Reservation, error)
	// Scan reserves the first of req's candidates that is free and passes
	// the probe, or returns an error wrapping ErrExhausted.
	Scan(ctx context.Context, req ScanRequest) (Reservation, error)
	// ScanBlock reserves n consecutive ports from the first base among
	// req's candidates for which all n are free and pass the probe: all
	// of them or none.
	ScanBlock(ctx context.Context, req ScanRequest, n int) ([]Reservation, error)
	// Release deletes own's reservation of key (zero own: this process);
	// an error wrapping ErrNotFound when own holds no such row.
	Release(ctx context.Context, key Key, own Owner) error
	// Transfer gives from's reservation of key to the live owner to.
	Transfer(ctx context.Context, key Key, from, to Owner) error
	// List returns the reservations that match f.
	List(ctx context.Context, f Filter) ([]Reservation, error)
	// Reap deletes the rows of owners that have exited and returns how
	// many.
	Reap(ctx context.Context) (int, error)
	// Recall returns the port last remembered for label and p.
	Recall(ctx context.Context, label string, p Protocol) (uint16, bool, error)
	// Remember records port as the one last handed out for label and p.
	Remember(ctx context.Context, label string, p Protocol, port uint16) error
	// ReservedPorts returns the distinct ports from first to last that
	// have at least one reservation.
	ReservedPorts(ctx context.Context, first, last uint16) ([]uint16, error)
	// Stats returns the store's counters since it was opened.
	Stats() Stats
	// Close releases the store's resources (not its reservations).
	Close() error
}
