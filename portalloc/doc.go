// Package portalloc hands out TCP and UDP ports that no other program on
// the host is given at the same time, and that come back by themselves
// when the program holding them exits.
//
// An Allocator reserves ports in a SQLite state store shared by every berth
// process of the user (package statestore), or, when that store cannot be
// used, in the legacy MRU file (package mru). Either way a port is
// bind-probed before it is handed out; in the store, inside the same
// transaction that records it, so no other berth process can choose it in
// between.
//
// # Reservation lifecycle
//
// A reservation belongs to the process that made it (pid and start time). It
// ends with Release, with Close (which releases everything the Allocator
// still holds), or when its owner exits: the next reservation that needs the
// port, the background sweep, or statestore's Reap deletes it. Transfer gives
// a reservation to another process, such as a child the caller started, so
// the port stays reserved exactly as long as that process runs.
//
// Several Allocators in one process share its identity, so the store has
// one row for a port however many of them hold it: a Reserve of a key the
// process already holds, from any Allocator, returns that reservation. Each
// such Reserve, and each Set and Pool that uses the row, takes a hold of
// it, counted process-wide per state store file; Release, Close, Set.Release
// and a failed AllocateSet drop holds, and the row is deleted only when the
// last hold in the process is dropped. So one Allocator's Close never frees
// a port that another Allocator of the process still hands out. Transfer
// refuses a row that anything else in the process holds too.
//
// # After Close
//
// Close is idempotent: a second Close returns nil. Config, Stats, Metrics,
// Backend, FallbackCause and Held stay readable after it (Held is then
// empty, and Metrics reports no Usage). Every other method returns an error
// wrapping ErrClosed: Allocate, AllocateBlock, Reserve, Listen,
// ListenPacket, AllocateSet, NewPool, Release, Transfer, Reap and Usage, and of its pools Take,
// Return and Update (Pool.Close is idempotent too). Set.Release returns nil
// after Close, as it does when there is nothing left to release: Close has
// already released what the set held. What only reads what a set or pool
// already has stays valid too: Set.Members, Set.Member, Set.Manifest,
// Set.WriteManifest, Member.Env, Pool.Status, Pool.Idle and Pool.Err. A
// call in flight when Close runs either completes or returns an error
// wrapping ErrClosed.
//
// # Fallback
//
// In ModeStateStoreWithFallback (the default) a store that cannot be used
// (a damaged or foreign database, a newer schema, a file system that fails)
// makes the Allocator serve from the MRU file, loudly: an error is logged
// (to standard error when Config.Logger is the zero Logger), Stats counts
// it and FallbackCause says why. A busy store (another process holds its
// lock past the time a call can wait) or a call that runs out of time is
// not such a reason: the call fails with an error wrapping
// ErrStoreUnavailable and the context's error, and the next call tries the
// store again. While the MRU file serves, it skips every port the store
// holds as long as the database can still be read (readers need no lock);
// when it cannot be read either, it serves blind, which is logged and
// counted in Stats.Blind. Every StoreRetryInterval the next call tries the
// store again, and the Allocator goes back to it once it works.
//
// # Losing the store
//
// The state store is a file, and files get deleted: a cache cleaner, an
// rm -rf of the state directory, a restore of an old copy, a truncation. An
// Allocator knows what it holds, so when its store's file is deleted,
// replaced or truncated under it, it opens the store at the same place
// again (a new, empty one if need be) and puts its reservations back:
// at its next write, which checks the file before and after, or within
// CheckInterval when it is idle. A reservation another process took in
// between cannot be put back; that is logged as an error naming both
// owners and counted in Stats.Lost (Stats.Restored counts those put back).
//
// On Linux no other process gets such a port even before its holder
// notices: for every reservation it holds for itself, the holder's process
// holds a socket bound to a name in the abstract unix namespace, which no
// file operation removes and which goes when the process goes. A store that
// has just been created reads those names and records their holders'
// reservations before it grants anything, and a store truncated to nothing
// is set aside with its WAL for a new one rather than left to block every
// caller. Elsewhere, a holder's reservations are missing from a new store
// until the holder notices, within one CheckInterval. Reservations held for
// another process (berth get's, which belong to the shell that ran it, or
// those passed on with Transfer) have no holder in this process to put them
// back: they are lost with the file, so keep the state directory (see
// Config.StateDir) out of reach of cleaners.
//
// A fleet's store (Config.Store) loses rows rather than a file: a failover
// to a PostgreSQL standby that had not received the last commits, or a
// forced retirement of the host. The Allocator compares what it holds with
// the store when a connection comes back to another or a restarted server
// and at every renewal of the host's lease (see pgstore.Store.Check), puts
// back what is missing in the same way, and does again its releases that
// are back in the store or failed while it could not be reached
// (Stats.Rereleased). A port it cannot put back stays held by it, and is
// tried, logged and counted again at each comparison, while the other
// process holds it.
//
// # Which port
//
// Allocate walks the range in Config.Order (a random stride, or lowest
// first), after the ports of Request.Prefer; AllocateBlock takes n
// consecutive ports at once.
//
// # Beyond single ports
//
// AllocateSet reserves the named ports of groups of processes and gives each
// member its environment; Listen binds a port inside the reserving
// transaction and package listenfd (Unix) passes the socket to a child; NewPool keeps ports
// reserved ahead of time for hot paths; Stats, Usage and Metrics expose
// metrics, and package expvarmetrics publishes them through expvar. Package
// porttest gives tests their ports.
//
// # Fleet-wide reservations
//
// With a Config.Store the hosts of a fleet share one PostgreSQL store
// (package pgstore), and an Allocator also serves owners that are not
// processes of a host: a pod not yet scheduled, a job. ReserveFleet
// reserves a port of a band of the caller's own that is free on every
// host, for a named holder under a lease on the server's clock;
// ReserveFleetSet reserves the ports of a SetSpec so, all or none. The
// holder's controller renews the leases (RenewFleet), gives a reservation
// its host once that is known (NarrowFleet) and releases it (ReleaseFleet);
// FleetLeases lists them. Such a reservation is the holder's, not the
// process's: Close leaves it, and a lease that runs out is reaped by any
// host. On the SQLite store these calls return a *FieldError for
// Config.Store.
//
// Importing portalloc (or porttest) has no side effects: it registers no
// HTTP handler, flag or expvar variable.
package portalloc
