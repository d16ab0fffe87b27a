package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gofrs/flock"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/statestore"
)

// Config is one torture run. Zero fields take the defaults shown.
type Config struct {
	Workers   int             // worker processes at any time (on each host of Hosts); zero: 6
	Duration  time.Duration   // how long workers run; zero: 20s
	Range     portalloc.Range // zero: 26000-26063, 64 ports, small enough to run full
	KillEvery time.Duration   // a random worker is SIGKILLed this often; zero: 500ms; negative: never
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
	// reservations there (Config.Store), in a schema the run makes for
	// itself and drops at the end, instead of in a SQLite file under Dir.
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
	// the standby had not received are then lost, as documented (see
	// portalloc's "Failover"), and until its holder puts a lost row back
	// (its next comparison with the store, which a new server sets off)
	// another process of its host may be granted the port. The checker
	// counts such conflicts apart (FailoverLost), and only those: a
	// conflict with a claim granted after the failover, or after its
	// holder's comparison, or any conflict with a synchronous standby, is
	// a violation. Zero: never.
	FailoverEvery time.Duration
	// SyncStandby makes the standby of FailoverEvery synchronous
	// (synchronous_standby_names='*'): every commit waits for it, and a
	// failover loses nothing.
	SyncStandby bool
	// Hosts, with a Store, runs the workers on that many hosts of one
	// fleet: network namespaces of their own (see internal/netns), whose
	// Config.Host is host-1 through host-N; Workers workers run on each,
	// and every grant is bound in its host's namespace. Linux only; it
	// needs root (ErrNeedsRoot). Zero: the workers run on this machine,
	// which is host-1 of the store when there is one.
	Hosts int
	// RetireEvery, with 2 Hosts or more, takes a random host down this
	// often: it SIGKILLs every process on it (its workers and their
	// children), retires it from another host with RetireHost, then
	// starts fresh workers there, which find its rows gone. Zero: 5s;
	// negative: never.
	RetireEvery time.Duration
	// FleetWorkers, with Hosts, runs that many fleet workers besides the
	// hosts' workers: each holds fleet-wide ports of Range
	// (pgstore.ReserveFleet, rows of no host), binds each in every host's
	// namespace, and is SIGKILLed at random like the others. Zero: 1,
	// none with ClockStep (a step of the server's clock ends their
	// leases); negative: none.
	FleetWorkers int
	// (With FailoverEvery and an asynchronous standby the default is
	// none: a fleet-wide lease lost with the last commits has no process
	// to put it back.)
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
	// error wrapping portalloc.ErrTransient are counted, not errors; a
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
var SmallRange = portalloc.Range{First: 26000, Last: 26063}

// Summary is the outcome of a run.
type Summary struct {
	Config
	Report
	Elapsed time.Duration
	// ReapedAtEnd is how many rows the final Reap deleted.
	ReapedAtEnd int
	// LeftBehind are rows of dead processes found after Reap.
	LeftBehind []string
}

// OK reports whether the run proved every invariant, without an
// unexpected error on the way.
func (s Summary) OK() bool {
	return s.ViolationCount == 0 && len(s.LeftBehind) == 0 && len(s.Errors) == 0 && s.Grants > 0 &&
		len(s.Hangs) == 0 && len(s.Overruns) == 0
}

// Run runs the harness. It returns an error when it could not run; a run
// that found violations returns them in the Summary.
func Run(ctx context.Context, cfg Config) (sum Summary, err error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 6
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 20 * time.Second
	}
	if cfg.Range == (portalloc.Range{}) {
		cfg.Range = SmallRange
	}
	if err := cfg.Range.Valid(); err != nil {
		return Summary{}, err
	}
	if cfg.KillEvery == 0 {
		cfg.KillEvery = 500 * time.Millisecond
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
		if cfg.Freeze {
			cfg.Timeout = time.Second
		}
	}
	if cfg.Freeze && !canFreeze {
		return Summary{}, errNoFreeze
	}
	faults := cfg.PGRestartEvery > 0 || cfg.FailoverEvery > 0
	if cfg.PGRestartEvery < 0 || cfg.FailoverEvery < 0 || (cfg.SyncStandby && cfg.FailoverEvery <= 0) {
		return Summary{}, errBadFaults
	}
	if faults && cfg.Store != "" && cfg.Store != StoreAuto {
		return Summary{}, errFaultsNeedOwnServer
	}
	if faults {
		cfg.Store = StoreAuto
	}
	if cfg.Hosts < 0 || (cfg.Hosts > 0 && cfg.Store == "") {
		return Summary{}, errHostsNeedStore
	}
	if cfg.LoseStore < 0 || (cfg.LoseStore > 0 && cfg.Store != "") {
		return Summary{}, errLoseStoreSQLite
	}
	if cfg.Leases && cfg.Store != "" {
		return Summary{}, errLeasesSQLite
	}
	if cfg.FDPressure && !canPressure {
		return Summary{}, errNoPressure
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	switch {
	case cfg.Hosts < 2:
		cfg.RetireEvery = 0
	case cfg.RetireEvery == 0:
		cfg.RetireEvery = 5 * time.Second
	case cfg.RetireEvery < 0:
		cfg.RetireEvery = 0
	}
	switch {
	case cfg.Hosts == 0 || cfg.FleetWorkers < 0:
		cfg.FleetWorkers = 0
	case cfg.FleetWorkers == 0 && cfg.FailoverEvery > 0 && !cfg.SyncStandby:
		// A fleet-wide lease lost with an asynchronous standby's last
		// commits has no process to put it back: only on request.
	case cfg.FleetWorkers == 0 && cfg.ClockStep:
		// A fleet-wide lease follows the server's clock, which the steps
		// move by 300 s: a step forward ends every lease on the spot, as
		// it would on a real server, and a host may then have the port
		// while the fleet worker still binds it. Only on request.
	case cfg.FleetWorkers == 0:
		cfg.FleetWorkers = 1
	}
	if cfg.Store != "" && !cfg.ClockStep {
		unlock, err := holdClock(ctx, cfg.Progress)
		if err != nil {
			return Summary{}, err
		}
		defer func() { _ = unlock() }()
	}
	var clock *clockStepper
	if cfg.ClockStep {
		if clock, err = startClockStepper(ctx); err != nil {
			return Summary{}, err
		}
		// The true time goes back however Run ends, a panic included; on
		// the normal path endLoop has set it back already, and this does
		// nothing.
		defer func() {
			if cerr := clock.close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}()
	}
	// The kernel is the referee only if no one else binds the range: two
	// runs on one range (a go test ./... next to a run by hand) would fail
	// each other's binds. They take turns. Workers in namespaces of the
	// run's own bind where no one else does.
	if cfg.Hosts == 0 {
		unlock, err := lockRange(ctx, cfg.Range, cfg.Progress)
		if err != nil {
			return Summary{}, err
		}
		defer func() { _ = unlock() }()
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "berth-torture-")
		if err != nil {
			return Summary{}, err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		cfg.Dir = dir
	}
	var pg *ownServer
	if cfg.Store == StoreAuto {
		dir, derr := serverDir(cfg.Dir)
		if derr != nil {
			return Summary{}, fmt.Errorf("torture: the server's directory: %w", derr)
		}
		var dsn string
		var perr error
		if pg, dsn, perr = startOwnServer(ctx, dir, cfg.FailoverEvery > 0, cfg.SyncStandby); perr != nil {
			return Summary{}, perr
		}
		// Stopped after the schema is dropped (deferred below).
		defer func() {
			if cerr := pg.close(ctx, cfg.Dir); cerr != nil {
				err = errors.Join(err, fmt.Errorf("torture: stop the run's server: %w", cerr))
			}
		}()
		cfg.Store = dsn
	}
	var hosts []netns.NS
	if cfg.Store != "" {
		dsn, drop, err := runSchema(ctx, cfg.Store)
		if err != nil {
			return Summary{}, err
		}
		defer func() { _ = drop() }()
		cfg.Store = dsn
		var remove func() error
		if hosts, remove, err = makeHosts(ctx, cfg.Hosts); err != nil {
			return Summary{}, err
		}
		defer func() {
			if rerr := remove(); rerr != nil {
				err = errors.Join(err, fmt.Errorf("torture: %w", rerr))
			}
		}()
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o700); err != nil {
		return Summary{}, err
	}
	log, err := openLog(cfg.Dir, "supervisor")
	if err != nil {
		return Summary{}, err
	}
	defer func() { _ = log.close() }()

	sup := &supervisor{cfg: cfg, log: log, rng: rand.New(rand.NewPCG(cfg.Seed, 1)), clock: clock, hosts: hosts, pg: pg}
	start := time.Now() // time.Since on it reads Go's monotonic clock: steps do not move it
	log.add(Event{Kind: KindStart, DurNS: int64(cfg.Timeout)})
	for h := range max(1, len(hosts)) {
		for range cfg.Workers {
			if err := sup.start(h); err != nil {
				sup.stopAll()
				return Summary{}, err
			}
		}
	}
	for range cfg.FleetWorkers {
		if err := sup.start(fleetHost); err != nil {
			sup.stopAll()
			return Summary{}, err
		}
	}
	err = sup.loop(ctx, start.Add(cfg.Duration))
	if endErr := sup.endLoop(); err == nil {
		err = endErr
	}
	if err != nil {
		sup.stopAll()
		return Summary{}, err
	}
	sum = Summary{Config: cfg}
	// While the last workers still run: no row of a killed one may survive a Reap.
	left, err := sup.checkStore(ctx, false)
	if err != nil {
		sup.stopAll()
		return Summary{}, err
	}
	sum.LeftBehind = append(sum.LeftBehind, left...)
	sup.stopAll()
	sum.Elapsed = time.Since(start)

	rep, err := Check(cfg.Dir)
	if err != nil {
		return Summary{}, err
	}
	if cfg.Hosts > 0 && rep.ProbeFailures-rep.FailoverProbes > 0 {
		// In namespaces of the run's own only the run binds: the store
		// let a worker claim a port that a holder it knew of had bound.
		rep.ViolationCount++
		rep.Violations = append(rep.Violations, fmt.Sprintf("%d bind probes failed: the store let workers claim ports a holder had bound (berth's probe kept them from being granted)", rep.ProbeFailures-rep.FailoverProbes))
		for _, k := range first(rep.ProbeKeys, 10) {
			rep.Violations = append(rep.Violations, "  probe failed: "+k)
		}
	}
	sum.Report = rep
	// The workers have gone and their children (which outlive killed
	// workers by design) end within a quarter second: after a Reap the
	// table must then be empty.
	deadline := time.Now().Add(15 * time.Second)
	for {
		left, err = sup.checkStore(ctx, true)
		if err != nil {
			return Summary{}, err
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sum.LeftBehind = append(sum.LeftBehind, left...)
	sum.ReapedAtEnd = sup.reapedAtEnd
	return sum, nil
}

// lockRange waits, as long as ctx allows, until no other run uses the
// range r, and returns the function that lets go of it. Runs on ranges
// that overlap without being equal do not see each other.
func lockRange(ctx context.Context, r portalloc.Range, progress io.Writer) (unlock func() error, err error) {
	l := flock.New(filepath.Join(os.TempDir(), fmt.Sprintf("berth-torture-%d-%d.lock", r.First, r.Last)))
	ok, err := l.TryLock()
	if err != nil {
		return nil, fmt.Errorf("torture: lock %s: %w", l.Path(), err)
	}
	if ok {
		return l.Unlock, nil
	}
	if progress != nil {
		fmt.Fprintf(progress, "waiting for another torture run on %s to end\n", r)
	}
	if _, err := l.TryLockContext(ctx, 50*time.Millisecond); err != nil {
		return nil, fmt.Errorf("torture: wait for another run on %s (%s): %w", r, l.Path(), err)
	}
	return l.Unlock, nil
}

type supervisor struct {
	cfg         Config
	log         *eventLog
	rng         *rand.Rand
	clock       *clockStepper // nil unless cfg.ClockStep
	hosts       []netns.NS    // the fleet's hosts with Hosts; none without
	pg          *ownServer    // the run's own server; nil without
	workers     []*workerProc
	frozen      []frozenWorker // workers stopped by SIGSTOP, a subset of workers
	started     int            // workers started, for their names
	killed      []killedWorker // identities of the workers killed
	reapedAtEnd int
}

type workerProc struct {
	cmd   *exec.Cmd
	stdin io.Closer
	name  string
	host  int // index in supervisor.hosts; fleetHost for a fleet worker
}

// fleetHost is the host index of a fleet worker, which runs on no host.
const fleetHost = -1

// killedWorker is a worker the supervisor killed: its identity, to find
// its rows after a Reap (pid and start time, since the pid will be
// reused), and its host's index.
type killedWorker struct {
	owner statestore.Owner
	host  int
}

// frozenWorker is a worker stopped until a time.
type frozenWorker struct {
	w     *workerProc
	until time.Time
}

// start starts a worker on the host of index h (0 without hosts), or a
// fleet worker (h is fleetHost) in this process's namespace.
func (s *supervisor) start(h int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	s.started++
	name := fmt.Sprintf("w%d", s.started)
	role := "worker"
	cmd := exec.Command(self)
	if len(s.hosts) > 0 && h != fleetHost {
		cmd = s.hosts[h].Command(self)
	}
	if h == fleetHost {
		role, name = "fleet", fmt.Sprintf("f%d", s.started)
	}
	cmd.Env = append(os.Environ(), envRole+"="+role, envDir+"="+s.cfg.Dir, envProc+"="+name,
		envRange+"="+s.cfg.Range.String(), envSeed+"="+strconv.FormatUint(s.rng.Uint64(), 10),
		envTimeout+"="+s.cfg.Timeout.String())
	if s.cfg.Leases && h != fleetHost {
		cmd.Env = append(cmd.Env, envLeases+"=1")
	}
	if s.cfg.FDPressure && h != fleetHost {
		cmd.Env = append(cmd.Env, envFDs+"=1")
	}
	if s.pg != nil && (s.cfg.PGRestartEvery > 0 || s.cfg.FailoverEvery > 0) {
		cmd.Env = append(cmd.Env, envFaults+"=1")
	}
	switch {
	case h == fleetHost:
		names := make([]string, len(s.hosts))
		for i, ns := range s.hosts {
			names[i] = ns.Name
		}
		cmd.Env = append(cmd.Env, envStore+"="+s.cfg.Store, envNetns+"="+strings.Join(names, ","))
	case s.cfg.Store != "":
		cmd.Env = append(cmd.Env, envStore+"="+s.cfg.Store, envHost+"="+hostName(h))
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("torture: start worker: %w", err)
	}
	s.workers = append(s.workers, &workerProc{cmd: cmd, stdin: stdin, name: name, host: h})
	return nil
}

// loop, until the deadline: kills a random worker every KillEvery and
// starts a replacement; steps the clock every 1-2 s (ClockStep); freezes a
// random worker about every second, and thaws or kills the frozen ones
// when their time is up (Freeze). Every time here is read from Go's
// monotonic clock, which the steps do not move.
func (s *supervisor) loop(ctx context.Context, deadline time.Time) error {
	var nextKill, nextStep, nextFreeze, nextRetire, nextLoss, nextRestart, nextFailover time.Time // zero: never
	now := time.Now()
	if s.cfg.PGRestartEvery > 0 {
		nextRestart = now.Add(s.cfg.PGRestartEvery)
	}
	if s.cfg.FailoverEvery > 0 {
		nextFailover = now.Add(s.cfg.FailoverEvery)
	}
	if s.cfg.LoseStore > 0 {
		nextLoss = now.Add(s.cfg.LoseStore)
	}
	if s.cfg.KillEvery > 0 {
		nextKill = now.Add(s.cfg.KillEvery)
	}
	if s.cfg.RetireEvery > 0 {
		nextRetire = now.Add(s.cfg.RetireEvery)
	}
	if s.clock != nil {
		nextStep = now.Add(s.stepGap())
	}
	if s.cfg.Freeze {
		nextFreeze = now.Add(s.freezeGap())
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		due := deadline
		for _, t := range []time.Time{nextKill, nextStep, nextFreeze, nextRetire, nextLoss, nextRestart, nextFailover} {
			if !t.IsZero() && t.Before(due) {
				due = t
			}
		}
		for _, f := range s.frozen {
			if f.until.Before(due) {
				due = f.until
			}
		}
		timer.Reset(time.Until(due))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		now := time.Now()
		if !now.Before(deadline) {
			return nil
		}
		if err := s.thawDue(ctx, now); err != nil {
			return err
		}
		if !nextKill.IsZero() && !now.Before(nextKill) {
			for !nextKill.After(now) {
				nextKill = nextKill.Add(s.cfg.KillEvery)
			}
			if err := s.kill(ctx, s.workers[s.rng.IntN(len(s.workers))]); err != nil {
				return err
			}
		}
		if !nextRetire.IsZero() && !now.Before(nextRetire) {
			nextRetire = now.Add(s.cfg.RetireEvery)
			if err := s.retire(ctx); err != nil {
				return err
			}
		}
		if !nextStep.IsZero() && !now.Before(nextStep) {
			nextStep = now.Add(s.stepGap())
			if err := s.stepClock(); err != nil {
				return err
			}
		}
		if !nextFreeze.IsZero() && !now.Before(nextFreeze) {
			nextFreeze = now.Add(s.freezeGap())
			if err := s.freezeOne(now); err != nil {
				return err
			}
		}
		if !nextRestart.IsZero() && !now.Before(nextRestart) {
			if err := s.restartServer(ctx); err != nil {
				return err
			}
			nextRestart = time.Now().Add(s.cfg.PGRestartEvery)
		}
		if !nextFailover.IsZero() && !now.Before(nextFailover) {
			if err := s.failover(ctx); err != nil {
				return err
			}
			nextFailover = time.Now().Add(s.cfg.FailoverEvery)
		}
		if !nextLoss.IsZero() && !now.Before(nextLoss) {
			nextLoss = now.Add(s.cfg.LoseStore)
			if err := s.loseStore(); err != nil {
				return err
			}
		}
	}
}

// The ways loseStore loses the store.
var losses = []struct {
	name string
	lose func(dir string) error
}{
	{"removed the state directory", func(dir string) error {
		// Workers make the directory again as it goes: try a few times.
		var err error
		for range 10 {
			if err = os.RemoveAll(dir); err == nil {
				return nil
			}
		}
		return err
	}},
	{"replaced the database with an empty file", func(dir string) error {
		db := filepath.Join(dir, statedir.DatabaseFile)
		if err := os.Remove(db); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return os.WriteFile(db, nil, 0o600)
	}},
	{"truncated the database", func(dir string) error {
		err := os.Truncate(filepath.Join(dir, statedir.DatabaseFile), 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil // lost already, and not made again yet
		}
		return err
	}},
}

// loseStore loses the workers' store in one of the ways of losses.
func (s *supervisor) loseStore() error {
	l := losses[s.rng.IntN(len(losses))]
	if err := l.lose(filepath.Join(s.cfg.Dir, "state")); err != nil {
		return fmt.Errorf("torture: lose the store: %w", err)
	}
	s.log.add(Event{Kind: KindLoseStore, Op: l.name})
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "%s\n", l.name)
	}
	return nil
}

func (s *supervisor) stepGap() time.Duration {
	return time.Second + time.Duration(s.rng.IntN(1000))*time.Millisecond
}

func (s *supervisor) freezeGap() time.Duration {
	return 500*time.Millisecond + time.Duration(s.rng.IntN(1000))*time.Millisecond
}

// kill SIGKILLs w, frozen or not, and starts a replacement.
func (s *supervisor) kill(ctx context.Context, w *workerProc) error {
	if err := s.killOnly(ctx, w); err != nil {
		return err
	}
	return s.start(w.host) // on the host it was on
}

// killOnly SIGKILLs w, frozen or not, and waits for it.
func (s *supervisor) killOnly(ctx context.Context, w *workerProc) error {
	pid := w.cmd.Process.Pid
	// Its identity, to find its rows after a Reap: pid and start time,
	// since the pid will be reused.
	id, idErr := statestore.LookupOwner(ctx, pid)
	// Logged before the signal: the victim's claims end no later.
	s.log.add(Event{Kind: KindKill, Proc: w.name, PID: pid})
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("torture: kill %s (pid %d): %w", w.name, pid, err)
	}
	_ = w.cmd.Wait()
	if idErr == nil {
		s.killed = append(s.killed, killedWorker{owner: id, host: w.host})
	}
	_ = w.stdin.Close()
	s.workers = slices.DeleteFunc(s.workers, func(x *workerProc) bool { return x == w })
	wasFrozen := len(s.frozen)
	s.frozen = slices.DeleteFunc(s.frozen, func(f frozenWorker) bool { return f.w == w })
	if s.cfg.Progress != nil {
		how := "killed worker"
		if len(s.frozen) < wasFrozen {
			how = "killed frozen worker"
		}
		fmt.Fprintf(s.cfg.Progress, "%s %s (pid %d)\n", how, w.name, pid)
	}
	return nil
}

// retire takes a random host down and brings it back: it SIGKILLs the
// host's workers, then every other process in its namespace (their
// children), retires it from another random host through
// pgstore.RetireHost, logs the retirement, and starts fresh workers
// there. The fleet workers, whose sockets on the host live in
// namespaces of their own processes, go on: their fleet-wide rows are no
// host's, and retirement leaves them.
func (s *supervisor) retire(ctx context.Context) error {
	v := s.rng.IntN(len(s.hosts))
	by := (v + 1 + s.rng.IntN(len(s.hosts)-1)) % len(s.hosts)
	for _, w := range slices.Clone(s.workers) {
		if w.host == v {
			if err := s.killOnly(ctx, w); err != nil {
				return err
			}
		}
	}
	// Only the workers' children are left there; the fleet workers, never
	// in a host's namespace but for the instant of a bind, are spared.
	fleet := map[int]bool{}
	for _, w := range s.workers {
		if w.host == fleetHost {
			fleet[w.cmd.Process.Pid] = true
		}
	}
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.hosts[v].KillAll(kctx, func(pid int) bool { return fleet[pid] }); err != nil {
		return fmt.Errorf("torture: take %s down: %w", hostName(v), err)
	}
	n, err := retireHost(ctx, s.cfg.Store, hostName(by), hostName(v), s.cfg.Timeout)
	for deadline := time.Now().Add(30 * time.Second); err != nil && s.pg != nil && unavailable(err) && time.Now().Before(deadline); {
		// A connection that died with a restart or a failover: the
		// operator tries again.
		time.Sleep(50 * time.Millisecond)
		n, err = retireHost(ctx, s.cfg.Store, hostName(by), hostName(v), s.cfg.Timeout)
	}
	if err != nil {
		return err
	}
	s.log.add(Event{Kind: KindRetire, Host: hostName(v), Reaped: int64(n)})
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "retired %s from %s: %d rows deleted\n", hostName(v), hostName(by), n)
	}
	for range s.cfg.Workers {
		if err := s.start(v); err != nil {
			return err
		}
	}
	return nil
}

// stepClock steps the wall clock once and logs the step.
func (s *supervisor) stepClock() error {
	d, err := s.clock.step(func(offset, frac time.Duration) time.Duration {
		return nextStep(s.rng, offset, frac)
	})
	if err != nil {
		return err
	}
	s.log.add(Event{Kind: KindClockStep, DurNS: int64(d)})
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "stepped the clock by %v\n", d)
	}
	return nil
}

// freezeOne stops a random running worker for 100 ms to 3 s, unless half
// the workers are frozen already: the others must be able to go on.
func (s *supervisor) freezeOne(now time.Time) error {
	if len(s.frozen) >= max(1, len(s.workers)/2) {
		return nil
	}
	var running []*workerProc
	for _, w := range s.workers {
		if !slices.ContainsFunc(s.frozen, func(f frozenWorker) bool { return f.w == w }) {
			running = append(running, w)
		}
	}
	w := running[s.rng.IntN(len(running))]
	d := 100*time.Millisecond + time.Duration(s.rng.IntN(2900))*time.Millisecond
	pid := w.cmd.Process.Pid
	// Logged before the signal: the frozen time it starts covers the stop.
	s.log.add(Event{Kind: KindFreeze, Proc: w.name, PID: pid, DurNS: int64(d)})
	if err := freeze(w.cmd.Process); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			// It exited on its own (and logged why); a kill replaces it.
			s.log.add(Event{Kind: KindThaw, Proc: w.name, PID: pid, Err: err.Error()})
			return nil
		}
		return fmt.Errorf("torture: freeze %s (pid %d): %w", w.name, pid, err)
	}
	s.frozen = append(s.frozen, frozenWorker{w: w, until: now.Add(d)})
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "froze worker %s (pid %d) for %v\n", w.name, pid, d)
	}
	return nil
}

// thawDue lets go of the workers whose frozen time is up, killing one in
// four instead.
func (s *supervisor) thawDue(ctx context.Context, now time.Time) error {
	var due []*workerProc
	for _, f := range s.frozen {
		if !now.Before(f.until) {
			due = append(due, f.w)
		}
	}
	for _, w := range due {
		if s.rng.IntN(4) == 0 {
			if err := s.kill(ctx, w); err != nil {
				return err
			}
			continue
		}
		if err := s.thaw(w); err != nil {
			return err
		}
	}
	return nil
}

// thaw sends w SIGCONT and logs it.
func (s *supervisor) thaw(w *workerProc) error {
	s.frozen = slices.DeleteFunc(s.frozen, func(f frozenWorker) bool { return f.w == w })
	pid := w.cmd.Process.Pid
	if err := thaw(w.cmd.Process); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("torture: thaw %s (pid %d): %w", w.name, pid, err)
	}
	// Logged after the signal: the frozen time it ends covers the stop.
	s.log.add(Event{Kind: KindThaw, Proc: w.name, PID: pid})
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "thawed worker %s (pid %d)\n", w.name, pid)
	}
	return nil
}

// endLoop ends the weather: it marks the end of the run in the log, thaws
// every frozen worker and sets the true time back.
func (s *supervisor) endLoop() error {
	s.log.add(Event{Kind: KindStop})
	var errs []error
	for len(s.frozen) > 0 { // thaw takes the worker off the list, whatever happens
		if err := s.thaw(s.frozen[0].w); err != nil {
			errs = append(errs, err)
		}
	}
	if s.clock != nil {
		if err := s.clock.close(); err != nil {
			errs = append(errs, err)
		} else if s.cfg.Progress != nil {
			fmt.Fprintln(s.cfg.Progress, "set the clock back to the true time")
		}
	}
	return errors.Join(errs...)
}

// stopAll ends the workers gracefully: closing stdin makes each release
// what it holds and exit. A worker that has not exited after stopWait is
// stuck, and logged as such.
func (s *supervisor) stopAll() {
	for len(s.frozen) > 0 { // a stopped worker cannot read its stdin
		_ = thaw(s.frozen[0].w.cmd.Process)
		s.frozen = s.frozen[1:]
	}
	for _, w := range s.workers {
		_ = w.stdin.Close()
	}
	wait := s.stopWait()
	for _, w := range s.workers {
		done := make(chan struct{})
		go func() { _ = w.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(wait):
			s.log.add(Event{Kind: KindStuck, Proc: w.name, PID: w.cmd.Process.Pid, DurNS: int64(wait)})
			_ = w.cmd.Process.Kill()
			<-done
		}
	}
	s.workers = nil
}

// stopWait bounds how long a worker takes to stop: its current call, then
// releasing up to maxHeld ports, each call bounded by the timeout but
// normally quick.
func (s *supervisor) stopWait() time.Duration { return 20*time.Second + 2*s.cfg.Timeout }

// checkStore reaps and lists the table, of every host with a Store. It
// returns the rows owned by killed workers (which must have been reaped);
// with all set, every row left counts, since no process of the run is
// alive.
func (s *supervisor) checkStore(ctx context.Context, all bool) ([]string, error) {
	if all {
		s.reapedAtEnd = 0
	}
	var left []string
	for h := range max(1, len(s.hosts)) {
		l, err := s.checkHost(ctx, h, all)
		if err != nil {
			return nil, err
		}
		left = append(left, l...)
	}
	return left, nil
}

// checkHost is checkStore for the host of index h.
func (s *supervisor) checkHost(ctx context.Context, h int, all bool) ([]string, error) {
	cfg := portalloc.Config{StateDir: filepath.Join(s.cfg.Dir, "state"), Timeout: s.cfg.Timeout}
	where := ""
	if s.cfg.Store != "" {
		cfg.Store, cfg.Host = s.cfg.Store, hostName(h)
		where = " on " + cfg.Host
	}
	st, err := fleet.OpenStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.Close() }()
	n, err := st.Reap(ctx)
	if err != nil {
		return nil, err
	}
	if all {
		s.reapedAtEnd += n
	}
	rows, err := st.List(ctx, statestore.Filter{})
	if err != nil {
		return nil, err
	}
	var left []string
	for _, r := range rows {
		if all || slices.ContainsFunc(s.killed, func(k killedWorker) bool { return k.host == h && r.Owner.Same(k.owner) }) {
			left = append(left, fmt.Sprintf("%s of pid %d%s left after Reap", r.Key, r.Owner.PID, where))
		}
	}
	return left, nil
}

// Print writes the summary for people.
func (s Summary) Print(w io.Writer) {
	secs := s.Elapsed.Seconds()
	var modes string
	if s.ClockStep {
		modes += ", clock stepping"
	}
	if s.Freeze {
		modes += ", freezing"
	}
	if s.LoseStore > 0 {
		modes += fmt.Sprintf(", store lost every %v", s.LoseStore)
	}
	if s.Leases {
		modes += ", leases"
	}
	if s.FDPressure {
		modes += ", descriptor pressure"
	}
	if s.PGRestartEvery > 0 {
		modes += fmt.Sprintf(", server restarted every %v", s.PGRestartEvery)
	}
	if s.FailoverEvery > 0 {
		kind := "asynchronous"
		if s.SyncStandby {
			kind = "synchronous"
		}
		modes += fmt.Sprintf(", failover to an %s standby every %v", kind, s.FailoverEvery)
	}
	workers := fmt.Sprintf("%d workers", s.Workers)
	switch {
	case s.Hosts > 0:
		workers = fmt.Sprintf("%d hosts of %d workers on PostgreSQL", s.Hosts, s.Workers)
	case s.Store != "":
		workers += " on PostgreSQL"
	}
	fmt.Fprintf(w, "berth torture: %s, %v, range %s (%d ports), kill every %v, timeout %v%s, seed %d\n",
		workers, s.Duration, s.Range, s.Range.Size(), s.KillEvery, s.Timeout, modes, s.Seed)
	fleet := ""
	if s.FleetWorkers > 0 {
		fleet = fmt.Sprintf(", %d fleet-wide", s.FleetGrants)
	}
	fmt.Fprintf(w, "grants          %d (%.0f/s): %d allocated, %d reserved, %d handed to children%s\n",
		s.Grants, float64(s.Grants)/secs, s.Allocations, s.Reservations, s.Handoffs, fleet)
	fmt.Fprintf(w, "range exhausted %d times\n", s.Exhausted)
	fmt.Fprintf(w, "kills           %d\n", s.Kills)
	if s.RetireEvery > 0 {
		fmt.Fprintf(w, "retirements     %d every %v (every process of the host killed first), %d rows deleted\n",
			s.Retirements, s.RetireEvery, s.RetiredRows)
	}
	if s.FleetWorkers > 0 {
		fmt.Fprintf(w, "fleet-wide      %d grants to %d fleet workers, %d binds (each grant on all %d hosts), band exhausted %d times; hosts' workers refused a fleet-wide port %d times\n",
			s.FleetGrants, s.FleetWorkers, s.FleetBinds, s.Hosts, s.FleetExhausted, s.LeaseRefusals)
	}
	if s.ClockStep {
		fmt.Fprintf(w, "clock steps     %d (%d of %v either way, %d across a second boundary); true time set back\n",
			s.ClockSteps, s.BigClockSteps, bigStep, s.ClockSteps-s.BigClockSteps)
	}
	if s.Freeze {
		fmt.Fprintf(w, "freezes         %d (%d killed while frozen), longest %v\n",
			s.Freezes, s.FrozenKills, s.LongestFreeze.Round(time.Millisecond))
	}
	if s.LoseStore > 0 {
		fmt.Fprintf(w, "store losses    %d (directory removed, file replaced or truncated); %d conflicts over hand-offs lost with the store, their worker killed before the child bound\n", s.StoreLosses, s.Unguarded)
	}
	if s.Leases {
		fmt.Fprintf(w, "leases          %d granted (%d reserved), %d renewals, %d released, %d ran out (%d dropped by their worker, %d of killed workers), %d found ended on renewal; %d conflicts over leases lost with the store, %d lease calls failed on a lost store\n",
			s.LeaseGrants, s.LeaseReservations, s.Renewals, s.LeaseReleases, s.LeaseExpiries, s.LeaseDrops, s.KilledLeases, s.LeasesEnded, s.LostLeases, s.LostCalls)
	}
	if s.FDPressure {
		fmt.Fprintf(w, "fd pressure     %d spells; %d calls failed with ErrTransient, %d binds refused with EMFILE (bound again after the spell), %d children not started for want of descriptors\n",
			s.PressureSpells, s.Transients, s.EMFILEBinds, s.Shortages)
	}
	if s.PGRestartEvery > 0 || s.FailoverEvery > 0 {
		if s.PGRestartEvery > 0 {
			fmt.Fprintf(w, "server restarts %d (pg_ctl restart -m fast), longest %v\n", s.Restarts, s.LongestRestart.Round(time.Millisecond))
		}
		if s.FailoverEvery > 0 {
			fmt.Fprintf(w, "failovers       %d (primary SIGKILLed, standby promoted, new standby built), longest %v\n", s.Failovers, s.LongestFailover.Round(time.Millisecond))
		}
		fmt.Fprintf(w, "repairs         %d comparisons with the store: %d rows put back, %d not (another process had the port), %d releases done again; %d calls failed on an unreachable server\n",
			s.Repairs, s.Restored, s.NotRestored, s.Rereleased, s.Unavailable)
		if s.FailoverEvery > 0 && !s.SyncStandby {
			fmt.Fprintf(w, "failover losses %d conflicts and %d bind probes that failed over rows an asynchronous failover lost, before their holder put them back (documented; not violations)\n",
				s.FailoverLost, s.FailoverProbes)
		}
	}
	fmt.Fprintf(w, "calls           %d returned, %d timed out\n", s.Calls, s.Timeouts)
	fmt.Fprintf(w, "longest gaps    %v without a grant (from +%.3fs), %v without a call returning (from +%.3fs); a hang is over %v\n",
		s.GrantGap.Dur.Round(time.Millisecond), s.GrantGap.At.Seconds(), s.CallGap.Dur.Round(time.Millisecond), s.CallGap.At.Seconds(),
		s.Timeout+HangMargin(s.Timeout))
	if n := len(s.Slowest); n > 0 {
		fmt.Fprintf(w, "slowest calls   each worker's slowest, of %d workers: median %v\n", n, s.Slowest[n/2].Dur.Round(time.Millisecond))
		for _, c := range s.Slowest[:min(n, 8)] {
			fmt.Fprintf(w, "  %s at +%.3fs\n", c, c.At.Seconds())
		}
	}
	fmt.Fprintf(w, "rows reaped     %d by workers, %d by the final reap\n", s.ReapedByWorkers, s.ReapedAtEnd)
	fmt.Fprintf(w, "bind failures   %d\n", s.BindFailures)
	fmt.Fprintf(w, "probe failures  %d\n", s.ProbeFailures)
	if s.Hosts > 1 {
		fmt.Fprintf(w, "shared ports    %d times two hosts held one key at once (allowed: ports are per host)\n", s.CrossHost)
	}
	if n := len(s.Latencies); n > 0 {
		fmt.Fprintf(w, "allocate        p50 %v  p99 %v  max %v  (n=%d)\n",
			Percentile(s.Latencies, 50).Round(time.Microsecond), Percentile(s.Latencies, 99).Round(time.Microsecond),
			s.Latencies[n-1].Round(time.Microsecond), n)
	}
	fmt.Fprintf(w, "errors          %d\n", len(s.Errors))
	for _, e := range first(s.Errors, 10) {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "left behind     %d\n", len(s.LeftBehind))
	for _, e := range first(s.LeftBehind, 10) {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "hangs           %d\n", len(s.Hangs))
	for _, e := range first(s.Hangs, 10) {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "overruns        %d\n", len(s.Overruns))
	for _, e := range first(s.Overruns, 10) {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "violations      %d\n", s.ViolationCount)
	for _, v := range first(s.Violations, 20) {
		fmt.Fprintf(w, "  %s\n", v)
	}
}

func first(xs []string, n int) []string { return xs[:min(len(xs), n)] }
