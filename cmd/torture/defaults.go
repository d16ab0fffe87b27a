package main

import (
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/berth-go/berth/store"
)

// Config is one torture run. Zero fields take the defaults shown. Each
// field is the flag of its name, which the command's doc describes.
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
	// ClockStep steps CLOCK_REALTIME every 1-2 s, as the package doc says. Linux only; it
	// needs root (ErrNeedsRoot) and moves the clock of every program on the host. Such
	// runs take turns through internal/clocklock.
	ClockStep bool
	// Freeze stops (SIGSTOP) a random worker about every second for 100 ms
	// to 3 s, then lets it go on (SIGCONT) or, one time in four, SIGKILLs
	// it while frozen. At most half the workers are frozen at once.
	Freeze bool
	// Store is a PostgreSQL connection string (portalloc.Config.StoreDSN)
	// for the workers' reservations, kept in a schema of the run's own;
	// zero: a SQLite file under Dir. A run on PostgreSQL without ClockStep
	// holds internal/clocklock throughout, since the server judges leases
	// by this machine's clock. StoreAuto has the run start a server of its
	// own under Dir, and stop and delete it at the end.
	Store string
	// PGRestartEvery restarts the run's own server (pg_ctl restart -m
	// fast) this often; no port may be granted twice. Zero: never.
	PGRestartEvery time.Duration
	// FailoverEvery fails the run's own primary over to its streaming standby this often,
	// and makes a new standby; what the checker allows then is in the package doc and
	// Report.FailoverLost. Zero: never.
	FailoverEvery time.Duration
	// SyncStandby makes that standby synchronous: a failover loses nothing.
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
	// Hosts, with a Store, runs Workers workers on each of that many
	// hosts: network namespaces (see internal/netns) whose Config.Host is
	// host-1 through host-N. Linux only; it needs root. Zero: the workers
	// run on this machine, which is host-1 of the store when there is one.
	Hosts int
	// RetireEvery, with 2 Hosts or more, SIGKILLs every process of a
	// random host this often, retires it from another host with Retire,
	// and starts fresh workers there. Zero: 5s; negative: never.
	RetireEvery time.Duration
	// FleetWorkers, with Hosts, runs that many fleet workers, holding
	// fleet-wide ports of Range and binding each on every host. Zero: 1,
	// none with ClockStep (a step of the server's clock ends their
	// leases); negative: none.
	FleetWorkers int
	// LoseStore, on the SQLite store, removes the state directory, or
	// replaces or truncates the database, at random this often. Holders
	// must put their rows back and no port may be granted twice meanwhile.
	// Zero: never.
	LoseStore time.Duration
	// Leases has every worker also hold ports through named holders'
	// leases of 2-3 s on the SQLite store. A lease holds its port until it
	// is released or runs out, whoever lives: no one else may be granted
	// the port before.
	Leases bool
	// FDPressure runs every worker under spells of descriptor shortage.
	// Calls that fail with an error wrapping store.ErrTransient are
	// counted, not errors. Linux only.
	FDPressure bool
	Dir        string // the run's state and logs; zero: a new temporary directory, removed afterwards
	Seed       uint64 // zero: random
	// Progress, when not nil, receives a line per kill, freeze and step.
	Progress io.Writer
}

// Run's errors for a Config it cannot honour.
var (
	errLoseStoreSQLite     = errors.New("torture: -lose-store takes a positive duration and works on the SQLite store only, not with -store")
	errLeasesSQLite        = errors.New("torture: -leases works on the SQLite store only, not with -store: it holds leases of one host")
	errHostsNeedStore      = errors.New("torture: -hosts needs -store: the hosts share their reservations through a PostgreSQL store")
	errFaultsNeedOwnServer = errors.New("torture: -pg-restart-every and -failover-every restart and kill a PostgreSQL server the run starts itself: leave -store out or set it to auto")
	errBadFaults           = errors.New("torture: -pg-restart-every and -failover-every take a positive duration; -sync-standby and -failover-kind need -failover-every, -failover-kind is kill, lag, commit-off or all (kill alone with -sync-standby); -faults needs -pg-restart-every or -failover-every")
	errNoPressure          = errors.New("torture: -fd-pressure counts a worker's descriptors in /proc/self/fd, which only Linux has")
	errNoFreeze            = errors.New("torture: freezing workers needs SIGSTOP, which this OS does not have")
)

// HangMargin is how much longer than its timeout a call may take before
// the run counts it as overrun, and how much longer than the timeout all
// the workers together may go without completing a call before the run
// counts a hang: half the timeout, at least one second.
func HangMargin(timeout time.Duration) time.Duration { return max(time.Second, timeout/2) }

// SmallRange is the default range: 64 ports for 6 workers of up to 32
// grants each, so exhaustion, reaping and contention happen all the time.
var SmallRange = store.Range{First: 26000, Last: 26063}

// setDefaults gives every zero field of c its default, or refuses c.
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
	case c.Hosts < 2, c.RetireEvery < 0:
		c.RetireEvery = 0
	case c.RetireEvery == 0:
		c.RetireEvery = 5 * time.Second
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
