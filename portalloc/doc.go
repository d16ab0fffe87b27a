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
// This package is the core: the Allocator, its Config, Request and
// Reservation, the range type, the errors, Listen, blocks of consecutive
// ports (AllocateBlock) and Transfer. Each further concept is a package of
// its own, built on the Allocator:
//
//   - portalloc/portset: the named ports of a set of processes, all or
//     none, with each member's environment variables;
//   - portalloc/pool: ports reserved ahead of time for hot paths, rolled
//     to a new spec a few at a time;
//   - portalloc/lease: ports of named holders under a lease, which outlive
//     the process that asked;
//   - portalloc/fleet: a fleet's PostgreSQL store (Config.StoreDSN), and
//     ports free on every host of the fleet;
//   - portalloc/statedir: where the state store lives by default, and why;
//   - portalloc/expvarmetrics: the range's usage, and the metrics through
//     expvar;
//   - portalloc/listenfd: a bound socket passed to a child (Unix);
//   - portalloc/scope: the scopes of Config.Scope, and labels in them;
//   - portalloc/exclude: what an Allocator leaves out of its range, and
//     why;
//   - portalloc/porttest: ports for tests.
//
// # State directory
//
// The store lives in a state directory, not a cache directory (see
// Config.StateDir): it records which live processes hold which ports, and
// cache cleaners delete a cache while those processes still run, after
// which their ports would be granted again. The default is
// $XDG_STATE_HOME/berth or ~/.local/state/berth on Linux (macOS: ~/Library/
// Application Support/berth, Windows: %LocalAppData%\berth). A store left
// at the previous default, os.UserCacheDir()/berth, is moved there with its
// reservations by the first Allocator that uses the default (see package
// statedir, which also says where the store is and why).
//
// Example is a whole program: it handles every error and releases what it
// takes. A program that stops on a signal (signal.NotifyContext) may defer
// Release, a set's Release and Close under the context the signal cancels:
// they release all the same, within Config.Timeout.
//
// # Reservation lifecycle
//
// A reservation belongs to the process that made it (pid and start time). It
// ends with Release, with Close (which releases everything the Allocator
// still holds), or when its owner exits: the next reservation that needs the
// port, the background sweep, or statestore's Reap deletes it. Transfer gives
// a reservation to another process, such as a child the caller started, so
// the port stays reserved exactly as long as that process runs; once it
// has exited, Close (or the Release of the set that handed it over)
// releases it.
//
// Several Allocators in one process share its identity, so the store has
// one row for a port however many of them hold it: a Reserve of a key the
// process already holds, from any Allocator, returns that reservation. Each
// such Reserve, and each set and pool that uses the row, takes a hold of
// it, counted process-wide per state store file; Release, Close, a set's
// Release and a failed set allocation drop holds, and the row is deleted
// only when the
// last hold in the process is dropped. So one Allocator's Close never frees
// a port that another Allocator of the process still hands out. Transfer
// refuses a row that anything else in the process holds too.
//
// # After Close
//
// Close is idempotent: a second Close returns nil. Config, Stats,
// Backend, FallbackCause, Database and Held stay readable after it (Held
// is then empty). Every other method returns an error wrapping ErrClosed:
// Allocate, AllocateBlock, Reserve, Listen, ListenPacket, Release,
// Transfer and Reap; so do the concept packages' calls that use the
// Allocator (see each package). A call in flight when Close runs either
// completes or returns an error wrapping ErrClosed.
//
// # Fallback
//
// In ModeStateStoreWithFallback (the default) a store that cannot be used
// (a damaged or foreign database, a newer schema, a file system that fails)
// makes the Allocator serve from the MRU file, loudly: an error is logged
// (to standard error when Config.Logger is the zero Logger), Stats counts
// it and FallbackCause says why. Waiting is not such a reason: a busy
// store (another process holds its lock past the time a call can wait) and
// a call that runs out of time fail with an error wrapping
// ErrStoreUnavailable and the context's error. Nor is a passing shortage:
// running out of file descriptors (EMFILE, ENFILE), memory, or disk space
// (ENOSPC, EDQUOT, SQLITE_FULL), or an interrupted call, fails with an
// error wrapping ErrStoreUnavailable and ErrTransient that names what ran
// short; the MRU file would meet the same shortage and knows less. The
// next call tries the store again.
//
// While the MRU file serves, it skips every port the store holds (it
// reads the database, which needs no lock) and every port the Allocator
// itself holds. When it cannot read the database either, it hands out
// nothing in this mode: the call fails with an error wrapping
// ErrStoreUnavailable that says why; `berth doctor` tells what to do. Only
// ModeMRU, chosen on purpose (BERTH_MODE=mru), serves blind then, which is
// logged and counted in Stats.Blind. Every 5 seconds the next call tries
// the store again, and the Allocator goes back to it once it
// works.
//
// # Losing the store
//
// The state store is a file, and files get deleted: a cache cleaner, an
// rm -rf of the state directory, a restore of an old copy, a truncation. An
// Allocator knows what it holds, so when its store's file is deleted,
// replaced or truncated under it, it opens the store at the same place
// again (a new, empty one if need be) and puts its reservations back:
// at its next write, which checks the file before and after, or within a
// second when it is idle. A reservation another process took in
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
// caller. A row handed to another process with Transfer stays marked by
// the process that handed it over, for as long as both run. Elsewhere, a
// holder's reservations are missing from a new store until the holder
// notices, within a second. Reservations whose owner holds no
// Allocator (berth get's, which belong to the shell that ran it, once berth
// has exited; a child's, once its parent has exited; a named holder's
// lease) have no one to put them back: they are lost with the file, so
// keep the state directory (see Config.StateDir) out of reach of cleaners.
//
// A fleet's store (Config.StoreDSN) loses rows rather than a file: a failover
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
// Listen and ListenPacket bind the port inside the reserving transaction
// and hand over the bound socket, so nothing can take the port between
// the reservation and the bind.
//
// # A fleet's store
//
// With a Config.StoreDSN the hosts of a fleet share one PostgreSQL store
// (package pgstore), opened by package portalloc/fleet (fleet.New), which
// a program imports when it wants one: portalloc itself links no
// PostgreSQL client, and an Allocator talks to any store through the
// interfaces of package store (store.Store, and store.FleetStore for
// fleet-wide reservations, which package fleet makes).
//
// Importing portalloc (or porttest) has no side effects: it registers no
// HTTP handler, flag or expvar variable.
package portalloc
