package main

import (
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/berth-go/berth/store"
)

// Config is one torture run. Zero fields take the defaults shown.
type Config struct {
	Workers   int           // worker processes at any time (on each host of Hosts); zero: 6
	Duration  time.Duration // how long workers run; zero: 20s
	Range     store.Range   // zero: 26000-26063, 64 ports, small enough to run full
	KillEvery time.Duration // a random worker is SIGKILLed this often; zero: 500ms; negative: never
	// Timeout bounds every portalloc call of the workers. A call that
	// gives up is counted, not an error; but no worker completing any call
	// for Timeout plus HangMargin(Timeout) is a hang, and fails the run.
	// Zero: 10s, or 1s with Freeze, so that a freeze (up to 3 s) of a
	// worker holding the store's lock outlasts the others' waits.
	Timeout time.Duration
	// ClockStep steps the system wall clock (CLOCK_REALTIME) every 1-2 s
	// while the workers run: 300 s forward or back, or 0.5-0.9 s across a
	// second boundary. Run sets the true time back before it returns,
	// whatever happens. Linux only; it needs root (ErrNeedsRoot) and moves
	// the clock of every program on the host. Runs that step the clock
	// take turns through internal/clocklock.
	ClockStep bool
	// Freeze stops (SIGSTOP) a random worker about every second for 100 ms
	// to 3 s, then lets it go on (SIGCONT) or, one time in four, SIGKILLs
	// it while frozen. At most half the workers are frozen at once.
	Freeze bool
	// Store is a PostgreSQL connection string: the workers keep their
	// reservations there (portalloc.Config.StoreDSN), in a schema the run
	// makes for itself and drops at the end, instead of in a SQLite file
	// under Dir.
	// Zero: the SQLite file. A server reached over its unix socket serves
	// workers in every namespace of Hosts. Since the server judges leases
	// by this machine's clock, a run on PostgreSQL without ClockStep holds
	// internal/clocklock throughout, so that no program that steps the
	// clock through it runs meanwhile (it waits for one that does).
	// StoreAuto ("auto") has the run start a server of its own, under
	// Dir, and stop and delete it at the end (also on an error or Ctrl-C;
	// not if the harness itself is SIGKILLed); PGRestartEvery and
	// FailoverEvery need one, and start one without a Store.
	Store string
	// PGRestartEvery restarts the run's own server (pg_ctl restart -m
	// fast) this often while the workers run: every connection is cut,
	// nothing committed is lost, and the server has a new start time, by
	// which every berth process finds out and compares its reservations
	// with the store. No port may be granted twice. Zero: never.
	PGRestartEvery time.Duration
	// FailoverEvery runs the store on a primary with a streaming standby
	// of the run's own, reached through one connection string naming both
	// with target_session_attrs=read-write, and fails over this often: it
	// SIGKILLs the primary and every process of it, promotes the standby,
	// and makes a new standby of the new primary (pg_basebackup) for the
	// next time. The standby is asynchronous unless SyncStandby: commits
	// the standby had not received are then lost, and the store's grace
	// period after a change of server holds every grant until the holders
	// have put their rows back (see pgstore's "Grace period"). So no
	// conflict is allowed, but one over the row of a port handed to a
	// child (which runs no berth code, and nobody puts back) met by a
	// fleet-wide grant once the grace period is over: the checker counts
	// those apart (FailoverLost). Zero: never.
	FailoverEvery time.Duration
	// SyncStandby makes the standby of FailoverEvery synchronous
	// (synchronous_standby_names='*'): every commit waits for it, and a
	// failover loses nothing.
	SyncStandby bool
	// FailoverKind is how an asynchronous standby loses commits at each
	// failover: FailoverKill (the primary SIGKILLed as it runs: the
	// commits in flight), FailoverLag (the standby's WAL receiver stopped
	// a second before: every commit of that second), FailoverCommitOff
	// (synchronous_commit off on the primary for half a second before:
	// commits acknowledged before they were written), or FailoverAll
	// (each in turn). Zero: FailoverKill.
	FailoverKind string
	// Faults, with PGRestartEvery or FailoverEvery, makes the run go on
	// past Duration until the server has been restarted or failed over
	// that many times. Zero: Duration alone.
	Faults int
	// Hosts, with a Store, runs the workers on that many hosts of one
	// fleet: network namespaces of their own (see internal/netns), whose
	// Config.Host is host-1 through host-N; Workers workers run on each,
	// and every grant is bound in its host's namespace. Linux only; it
	// needs root (ErrNeedsRoot). Zero: the workers run on this machine,
	// which is host-1 of the store when there is one.
	Hosts int
	// RetireEvery, with 2 Hosts or more, takes a random host down this
	// often: it SIGKILLs every process on it (its workers and their
	// children), retires it from another host with Retire, then
	// starts fresh workers there, which find its rows gone. Zero: 5s;
	// negative: never.
	RetireEvery time.Duration
	// FleetWorkers, with Hosts, runs that many fleet workers besides the
	// hosts' workers: each holds fleet-wide ports of Range
	// (pgstore.ReserveFleet, rows of no host), binds each in every host's
	// namespace, renews its leases, and renews them all at once when its
	// store says to compare (after a change of server: that puts back, in
	// the grace period, those a failover lost), and is SIGKILLed at
	// random like the others. Zero: 1, none with ClockStep (a step of the
	// server's clock ends their leases); negative: none.
	FleetWorkers int
	// LoseStore, on the SQLite store, loses the store under the workers
	// this often: at random it removes the state directory, replaces the
	// database with an empty file, or truncates it in place, as a cache
	// cleaner or a careless rm would. Holders must put their rows back and
	// no port may be granted twice meanwhile. Zero: never.
	LoseStore time.Duration
	// Leases has every worker also hold ports through named holders'
	// leases on the SQLite store (lease.Allocate, lease.Reserve): holders
	// "w3/lease-7", TTLs of 2-3 s. A worker binds each leased port and
	// keeps it bound while it renews the lease; it releases some
	// (lease.Release) and drops others (closes the socket, stops renewing),
	// and a killed worker's leases stay. A lease holds its port until it
	// is released or runs out, whoever lives: no one else may be granted
	// the port before. SQLite store only.
	Leases bool
	// FDPressure runs every worker under spells of descriptor shortage:
	// at random it lowers its own soft RLIMIT_NOFILE to what it has open
	// plus 0-2 for up to 0.6 s, then sets it back. Calls that fail with an
	// error wrapping store.ErrTransient are counted, not errors; a
	// bind that fails with EMFILE is counted apart and made again once the
	// spell is over, since a grant must still be bound. Linux only.
	FDPressure bool
	Dir        string // the run's state and logs; zero: a new temporary directory, removed afterwards
	Seed       uint64 // zero: random
	// Progress, when not nil, receives a line per kill, freeze and step.
	Progress io.Writer
}

// errLoseStoreSQLite: -lose-store deletes files, and a PostgreSQL store has
// none of the run's to delete.
var errLoseStoreSQLite = errors.New("torture: -lose-store takes a positive duration and works on the SQLite store only, not with -store")

// errLeasesSQLite: -leases uses the leases of one host, which the SQLite
// store keeps.
var errLeasesSQLite = errors.New("torture: -leases works on the SQLite store only, not with -store: it holds leases of one host")

// errHostsNeedStore: a run across hosts with nothing for them to share.
var errHostsNeedStore = errors.New("torture: -hosts needs -store: the hosts share their reservations through a PostgreSQL store")

// HangMargin is how much longer than its timeout a call may take before
// the run counts it as overrun, and how much longer than the timeout all
// the workers together may go without completing a call before the run
// counts a hang: half the timeout, at least one second.
func HangMargin(timeout time.Duration) time.Duration { return max(time.Second, timeout/2) }

// SmallRange is the default range: 64 ports for 6 workers of up to 32
// grants each, so exhaustion, reaping and contention happen all the time.
var SmallRange = store.Range{First: 26000, Last: 26063}

// setDefaults gives every zero field of c its default and refuses a
// combination of fields the run cannot honour, with an error naming the
// flag.
func (c *Config) setDefaults() error {
	if c.Workers <= 0 {
		c.Workers = 6
	}
	if c.Duration <= 0 {
		c.Duration = 20 * time.Second
	}
	if c.Range == (store.Range{}) {
		c.Range = SmallRange
	}
	if err := c.Range.Validate(); err != nil {
		return err
	}
	if c.KillEvery == 0 {
		c.KillEvery = 500 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
		if c.Freeze {
			c.Timeout = time.Second
		}
	}
	if c.Freeze && !canFreeze {
		return errNoFreeze
	}
	faults := c.PGRestartEvery > 0 || c.FailoverEvery > 0
	if c.PGRestartEvery < 0 || c.FailoverEvery < 0 || (c.SyncStandby && c.FailoverEvery <= 0) {
		return errBadFaults
	}
	if faults && c.Store != "" && c.Store != StoreAuto {
		return errFaultsNeedOwnServer
	}
	switch {
	case c.FailoverKind == "":
		c.FailoverKind = FailoverKill
	case !slices.Contains(failoverKinds, c.FailoverKind) || c.FailoverEvery <= 0 || (c.SyncStandby && c.FailoverKind != FailoverKill):
		return errBadFaults
	}
	if c.Faults < 0 || (c.Faults > 0 && !faults) {
		return errBadFaults
	}
	if faults {
		c.Store = StoreAuto
	}
	if c.Hosts < 0 || (c.Hosts > 0 && c.Store == "") {
		return errHostsNeedStore
	}
	if c.LoseStore < 0 || (c.LoseStore > 0 && c.Store != "") {
		return errLoseStoreSQLite
	}
	if c.Leases && c.Store != "" {
		return errLeasesSQLite
	}
	if c.FDPressure && !canPressure {
		return errNoPressure
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	switch {
	case c.Hosts < 2:
		c.RetireEvery = 0
	case c.RetireEvery == 0:
		c.RetireEvery = 5 * time.Second
	case c.RetireEvery < 0:
		c.RetireEvery = 0
	}
	switch {
	case c.Hosts == 0 || c.FleetWorkers < 0:
		c.FleetWorkers = 0
	case c.FleetWorkers == 0 && c.ClockStep:
		// A fleet-wide lease follows the server's clock, which the steps
		// move by 300 s: a step forward ends every lease on the spot, as
		// it would on a real server, and a host may then have the port
		// while the fleet worker still binds it. Only on request.
	case c.FleetWorkers == 0:
		c.FleetWorkers = 1
	}
	return nil
}
