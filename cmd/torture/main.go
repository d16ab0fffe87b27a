// Command torture proves berth's promise under load, crashes and
// contention, with the operating system as the referee.
//
//	go run ./cmd/torture                      # 20 s on 64 ports, 6 workers
//	go run ./cmd/torture -duration 10m -range 20000-32767
//	sudo go run ./cmd/torture -clock-step     # steps the system clock: root only
//	go run ./cmd/torture -freeze              # SIGSTOPs random workers
//	go run ./cmd/torture -leases -fd-pressure -lose-store 1s
//	sudo go run ./cmd/torture -store "$DSN" -hosts 3 -workers 2   # a fleet: root only
//	sudo go run ./cmd/torture -hosts 2 -workers 3 -pg-restart-every 4s -duration 30s
//	sudo go run ./cmd/torture -hosts 2 -workers 3 -failover-every 6s -sync-standby -duration 30s
//
// A supervisor starts worker processes (this same binary) that share one
// state directory. Each worker allocates, reserves, releases and hands
// ports to short-lived children at random, and binds every grant at once,
// so a port handed out twice fails the second bind in the kernel, not in
// berth's bookkeeping. The supervisor SIGKILLs random workers and starts
// replacements. Every process appends its events to a log of its own;
// afterwards Check reads them all and proves that no two conflicting
// grants were live at the same time, that every grant could be bound, and
// that the store keeps no row of a dead process once reaped.
//
// Each mode is described by its flag (-h); what the checker makes of it:
//
//   - -clock-step and -freeze: berth must not take a live owner for a dead
//     one because the wall clock moved, and the workers a frozen one leaves
//     behind (now and then inside the store's write lock) must go on, their
//     waits bounded. Events are stamped with a clock no one steps, and some
//     worker must complete a call at least every -timeout plus HangMargin.
//     The true time is set back at the end, also on an error or Ctrl-C.
//   - -store and -hosts: the workers keep their reservations in PostgreSQL
//     (a schema the run makes and drops); N network namespaces stand in for
//     N hosts. Two hosts may hold one key at once, one host never. Hosts
//     are retired while their processes are dead (pgstore's Retire), and
//     fleet workers bind their fleet-wide ports on every host: the store
//     must keep those ports off every host.
//   - -leases: a lease's claim lasts until its release, or until the start
//     of its last grant or renewal plus its TTL (the store judges leases by
//     CLOCK_BOOTTIME, which no clock step moves); any conflicting grant
//     meanwhile is a violation, and so is a lease said to have ended early.
//   - -fd-pressure: calls that fail wrapping store.ErrTransient are counted,
//     not errors, and a bind that fails with EMFILE is made again later.
//   - -pg-restart-every and -failover-every run a server of the run's own
//     (as the OS user postgres when root). Every berth process finds the
//     new server by its start time and compares its reservations with it;
//     after a failover to an asynchronous standby, the grace period holds
//     every grant until the holders have put their rows back. The checker
//     counts apart only conflicts over the row of a port handed to a child
//     (which nobody puts back) met by a fleet-wide grant. A run on
//     PostgreSQL takes turns with -clock-step runs (internal/clocklock):
//     the server judges leases by this machine's clock.
//
// It exits 1 when any invariant was violated, 2 on a bad flag or when
// -clock-step or -hosts lacks root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/berth-go/berth/store"

	"github.com/berth-go/berth/internal/netns"
)

func main() {
	MaybeRunRole() // workers and children are this same binary

	cfg, err := configFromFlags(flag.CommandLine, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		os.Exit(2)
	}
	// Run sets a stepped clock back before it returns: let every signal
	// that ends a terminal session end it through ctx instead.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	sum, err := Run(ctx, cfg)
	if err != nil {
		msg, code := runFailure(err)
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(code)
	}
	sum.Print(os.Stdout)
	if !sum.OK() {
		os.Exit(1)
	}
}

// configFromFlags defines the command's flags on fs, parses args and
// returns the Config they make. fs's ErrorHandling decides what a bad
// flag does; a bad -range value is returned as an error naming it.
func configFromFlags(fs *flag.FlagSet, args []string) (Config, error) {
	var (
		cfg     Config
		rangeS  string
		verbose bool
	)
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long the workers run")
	fs.IntVar(&cfg.Workers, "workers", 6, "worker processes")
	fs.StringVar(&rangeS, "range", SmallRange.String(), "port range FIRST-LAST")
	fs.DurationVar(&cfg.KillEvery, "kill-every", 500*time.Millisecond, "SIGKILL a random worker this often (negative: never)")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "bound of every portalloc call of the workers (default 10s, 1s with -freeze)")
	fs.BoolVar(&cfg.ClockStep, "clock-step", false, "step the system clock (CLOCK_REALTIME) every 1-2 s while workers run; needs root")
	fs.BoolVar(&cfg.Freeze, "freeze", false, "SIGSTOP a random worker about every second for 100ms-3s, then SIGCONT or SIGKILL it")
	fs.StringVar(&cfg.Store, "store", "", `keep the reservations in this PostgreSQL database (a connection string), in a schema of the run's own; "auto": in a server the run starts (as the OS user postgres when root) and deletes`)
	fs.DurationVar(&cfg.PGRestartEvery, "pg-restart-every", 0, "restart the run's own PostgreSQL server (pg_ctl restart -m fast) this often; starts one without -store (default: never)")
	fs.DurationVar(&cfg.FailoverEvery, "failover-every", 0, "run the store on a primary and a streaming standby of the run's own, and fail over this often: SIGKILL the primary, promote the standby, build a new standby (default: never)")
	fs.BoolVar(&cfg.SyncStandby, "sync-standby", false, "with -failover-every: a synchronous standby (synchronous_standby_names='*'), so that a failover loses nothing")
	fs.StringVar(&cfg.FailoverKind, "failover-kind", "", "with -failover-every and an asynchronous standby, how a failover loses commits: kill (the primary SIGKILLed as it runs), lag (the standby's WAL receiver stopped 1s before), commit-off (synchronous_commit off on the primary 0.5s before), all (each in turn) (default kill)")
	fs.IntVar(&cfg.Faults, "faults", 0, "with -pg-restart-every or -failover-every: go on past -duration until the server has been restarted or failed over this many times")
	fs.IntVar(&cfg.Hosts, "hosts", 0, "with -store: run -workers workers on each of this many hosts, network namespaces named host-1..N; needs root")
	fs.DurationVar(&cfg.RetireEvery, "retire-every", 5*time.Second, "with 2 -hosts or more: kill every process of a random host, retire it from another, and restart it this often (negative: never)")
	fs.IntVar(&cfg.FleetWorkers, "fleet-workers", 0, "with -hosts: workers that hold fleet-wide ports and bind each on every host (default 1, none with -clock-step; negative: none)")
	fs.DurationVar(&cfg.LoseStore, "lose-store", 0, "remove the state directory, or replace or truncate the database, at random this often (SQLite store only; default: never)")
	fs.BoolVar(&cfg.Leases, "leases", false, "workers also hold ports under named holders' leases of 2-3 s, renewed while they live (SQLite store only)")
	fs.BoolVar(&cfg.FDPressure, "fd-pressure", false, "workers lower their own RLIMIT_NOFILE to what they have open, at random, for up to 0.6 s (Linux only)")
	fs.StringVar(&cfg.Dir, "dir", "", "keep state and logs here (default: a temporary directory, removed)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed (default: random)")
	fs.BoolVar(&verbose, "v", false, "print each kill, freeze and clock step")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	r, err := store.ParseRange(rangeS)
	if err != nil {
		return Config{}, fmt.Errorf("-range: %w", err)
	}
	cfg.Range = r
	if verbose {
		cfg.Progress = os.Stderr
	}
	return cfg, nil
}

// runFailure is what the command prints for an error of Run, and its exit
// status: 2 for a flag the run cannot honour here (a mode this OS or user
// lacks, a combination that makes no sense), 1 for a run that failed.
func runFailure(err error) (msg string, code int) {
	if errors.Is(err, ErrNeedsRoot) {
		return "torture: -clock-step: " + strings.TrimPrefix(err.Error(), "torture: "), 2
	}
	if errors.Is(err, netns.ErrUnsupported) || errors.Is(err, errHostsNeedStore) || errors.Is(err, errLoseStoreSQLite) ||
		errors.Is(err, errLeasesSQLite) || errors.Is(err, errNoPressure) || errors.Is(err, errBadFaults) || errors.Is(err, errFaultsNeedOwnServer) {
		return err.Error(), 2
	}
	return "torture: " + err.Error(), 1
}

// Run runs the harness. It returns an error when it could not run; a run
// that found violations returns them in the Summary.
//
// A run goes in four steps, a file each: Config.setDefaults (defaults.go),
// setup (setup.go), supervisor.drive, the workers and the weather
// (loop.go), and supervisor.verify (verify.go).
func Run(ctx context.Context, cfg Config) (sum Summary, err error) {
	if err := cfg.setDefaults(); err != nil {
		return Summary{}, err
	}
	// Whatever happens from here on, a panic included, what setup made is
	// undone: the true time set back, the server stopped, the locks let go.
	var td teardown
	defer func() {
		if terr := td.run(); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	sup, err := setup(ctx, cfg, &td)
	if err != nil {
		return Summary{}, err
	}
	start := time.Now() // time.Since on it reads Go's monotonic clock: steps do not move it
	if err := sup.drive(ctx, start.Add(sup.cfg.Duration)); err != nil {
		return Summary{}, err
	}
	return sup.verify(ctx, start)
}
