// Package portalloc hands out TCP and UDP ports that no other program on
// the host is given at the same time, and that come back by themselves
// when the program holding them exits.
//
// # The guarantee and the record
//
// Every port an Allocator grants is held twice. The guarantee is a kernel
// lock (package portlock): a name in Linux's abstract unix namespace
// (elsewhere a locked file) that one process at a time can hold and that
// the kernel frees when its holder dies, however it dies. Every grant of
// every berth process takes the lock of its key before it is recorded,
// whatever store it keeps, so no two berth processes, and no berth process
// and a test using porttest, are ever granted conflicting keys. The record
// is a row of a store: package statestore's SQLite file, shared by the
// berth processes of a host, or package pgstore's PostgreSQL database,
// shared by a fleet. It carries what a lock cannot: labels, sticky ports,
// owners, named holders with leases, listings. A port is also bind-probed
// while its lock is held, inside the store's write that records it, so a
// port some other program has bound is passed over.
//
// Two keys of one protocol and port conflict when their addresses are
// equal or either is a wildcard (0.0.0.0, ::): the kernel's rule for
// listening sockets, with the IPv6 wildcard taken as dual-stack.
//
// # Reservation lifecycle
//
// A reservation belongs to the process that made it (its pid and start).
// It ends with Release, with Close (which releases what the Allocator still
// holds), or when its owner exits: the lock goes at once, and the row is
// deleted by the next grant it stands in the way of, by the store's
// background sweep, or by Reap.
//
// Transfer gives a reservation to another running process, typically a
// child the caller started: the port then stays reserved exactly as long as
// that process runs. The lock goes with it. A child started with copies of
// the lock (Files, in exec.Cmd.ExtraFiles) holds it itself; for any other
// process, on Linux, a keeper holds it: a small process per owner, started
// from the caller's own executable, that holds the locks it is handed until
// its owner exits (see portlock.Keeper). A reservation of a named holder
// (Request.Holder, with a TTL) outlives the process that asked; its lock is
// held by the holder's keeper until the lease ends (Renew extends both) or
// ReleaseHolder. A keeper killed takes its locks with it: its owner's rows
// still keep the ports from every berth of the same store.
//
// The Allocators of one process share one handle per store (as sql.Open
// shares a *sql.DB): one record of what the process holds, one row per
// key. A Reserve of a key the process holds, from any Allocator, returns
// that reservation and takes a hold of it; sets and pools take holds too.
// The row and lock go when the last hold is dropped, so one Allocator's
// Close never frees a port another Allocator of the process still uses.
//
// # A lost store
//
// A store is a file, and files get deleted: a cache cleaner, an rm -rf of
// the state directory, a restore of an old copy, a truncation. That loses
// rows, never the guarantee: the locks are held by processes, not files,
// so no grant of any berth process can take a port a live holder keeps,
// whatever became of the file. The handle notices the loss (at its next
// write, or within a second when idle), opens the store again at the same
// place and puts the process's rows back (Stats.Restored). Rows of owners
// that hold no Allocator (a keeper's owner, a named holder) are kept by
// their locks until the owner exits or the lease ends; they are missing
// from listings meanwhile, where berth ls shows their locks instead. A
// fleet's store loses rows the same way in a failover to a standby that had
// not received the last commits; the handle compares and puts back alike
// (Stats.Rereleased counts releases it had to do again).
//
// # Fallback
//
// In ModeStateStoreWithFallback (the default) a store that cannot be used
// (damaged, written by a newer berth in a way this one must not write to, a
// file system that fails) makes the Allocator serve from the MRU file,
// loudly: a warning is logged (to standard error when Config.Logger is the
// zero Logger), and Stats.Fallback says why. Every grant still takes its
// lock, so the guarantee holds; only the record is thinner (no labels, no
// listings, no named holders). Waiting is no reason to fall back: a busy
// store, or a passing shortage of descriptors, memory or disk, fails the
// call with an error wrapping store.ErrUnavailable or store.ErrTransient
// that says what ran short. The store is tried again every 5 seconds.
//
// # After Close
//
// Close is idempotent. Config, Stats and Held stay readable after it (Held
// is then empty); every other method returns an error wrapping
// store.ErrClosed, as do the calls of the packages built on an Allocator.
// A call in flight when Close runs either completes or returns such an
// error.
//
// # Packages built on the Allocator
//
//   - portalloc/portset: the named ports of a set of processes, all or
//     none, with each member's environment variables;
//   - portalloc/pool: ports reserved ahead of time, rolled to a new spec a
//     few at a time;
//   - portalloc/fleet: a fleet's PostgreSQL store (Config.StoreDSN), and
//     ports free on every host of the fleet;
//   - portalloc/listenfd: bound sockets passed to a child, as systemd does;
//   - portalloc/who: who holds a port (reservations, locks, sockets);
//   - portalloc/expvarmetrics: Stats and Usage published through expvar;
//   - portlock/porttest (module github.com/berth-go/berth/portlock): ports
//     for tests, with a lock and no store.
//
// portalloc links no PostgreSQL client: package fleet does. Importing
// portalloc has no side effects: it registers no HTTP handler, flag or
// expvar variable.
package portalloc
