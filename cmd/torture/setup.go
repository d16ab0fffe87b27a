package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-go/berth/store"

	"github.com/gofrs/flock"

	"github.com/berth-go/berth/internal/clocklock"
	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/pgstore"
)

// teardown undoes setup, last step first. Each step returns the error
// worth reporting, or nil when its failure does not matter.
type teardown []func() error

// add has run undo f, before every step added earlier.
func (t *teardown) add(f func() error) { *t = append(*t, f) }

// run takes every step, last added first, and joins their errors.
func (t teardown) run() error {
	var errs []error
	for i := len(t) - 1; i >= 0; i-- {
		if err := t[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// setup makes everything the workers of cfg (defaults set) need: the
// clock's lock or its stepper, the range's lock, the run's directory, a
// PostgreSQL server and schema, the hosts' namespaces, and the
// supervisor's log. It adds to td how to undo each as it goes, so that
// td undoes what was made also when setup fails or panics half way. The
// supervisor it returns has the final Config: its Dir and its Store (the
// schema's connection string).
func setup(ctx context.Context, cfg Config, td *teardown) (*supervisor, error) {
	var err error
	if cfg.Store != "" && !cfg.ClockStep {
		unlock, err := holdClock(ctx, cfg.Progress)
		if err != nil {
			return nil, err
		}
		td.add(func() error { _ = unlock(); return nil })
	}
	var clock *clockStepper
	if cfg.ClockStep {
		if clock, err = startClockStepper(ctx); err != nil {
			return nil, err
		}
		// The true time goes back however Run ends, a panic included; on
		// the normal path endLoop has set it back already, and this does
		// nothing.
		td.add(clock.close)
	}
	// The kernel is the referee only if no one else binds the range: two
	// runs on one range (a go test ./... next to a run by hand) would fail
	// each other's binds. They take turns. Workers in namespaces of the
	// run's own bind where no one else does.
	if cfg.Hosts == 0 {
		unlock, err := lockRange(ctx, cfg.Range, cfg.Progress)
		if err != nil {
			return nil, err
		}
		td.add(func() error { _ = unlock(); return nil })
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "berth-torture-")
		if err != nil {
			return nil, err
		}
		td.add(func() error { _ = os.RemoveAll(dir); return nil })
		cfg.Dir = dir
	}
	var pg *ownServer
	if cfg.Store == StoreAuto {
		var dsn string
		if pg, dsn, err = startOwnServer(ctx, cfg.Dir, cfg.FailoverEvery > 0, cfg.SyncStandby); err != nil {
			return nil, err
		}
		// Stopped after the schema is dropped (added before it).
		runDir := cfg.Dir
		td.add(func() error {
			if cerr := pg.close(ctx, runDir); cerr != nil {
				return fmt.Errorf("torture: stop the run's server: %w", cerr)
			}
			return nil
		})
		cfg.Store = dsn
	}
	var hosts []netns.NS
	if cfg.Store != "" {
		// A schema of the run's own, so that no row of another run or of a
		// fleet's real hosts meets the run's; dropped even when ctx has
		// ended: the run is over then.
		dsn, drop, err := pgschema.Create(ctx, cfg.Store, "berth_torture")
		if err != nil {
			return nil, fmt.Errorf("torture: -store: %w", err)
		}
		td.add(func() error { _ = drop(); return nil })
		cfg.Store = dsn
	}
	if cfg.Hosts > 0 {
		// Named after this process, so that two runs never meet. A
		// supervisor that is SIGKILLed leaves them behind, for "ip netns
		// delete berth-torture-PID-N".
		var remove func() error
		if hosts, remove, err = netns.AddN(ctx, fmt.Sprintf("berth-torture-%d", os.Getpid()), cfg.Hosts); err != nil {
			return nil, fmt.Errorf("torture: -hosts: %w", err)
		}
		td.add(func() error {
			if rerr := remove(); rerr != nil {
				return fmt.Errorf("torture: %w", rerr)
			}
			return nil
		})
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o700); err != nil {
		return nil, err
	}
	log, err := openLog(cfg.Dir, "supervisor")
	if err != nil {
		return nil, err
	}
	td.add(func() error { _ = log.f.Close(); return nil })
	return &supervisor{cfg: cfg, log: log, rng: rand.New(rand.NewPCG(cfg.Seed, 1)), clock: clock, hosts: hosts, pg: pg}, nil
}

// lockRange waits, as long as ctx allows, until no other run uses the
// range r, and returns the function that lets go of it. Runs on ranges
// that overlap without being equal do not see each other.
func lockRange(ctx context.Context, r store.Range, progress io.Writer) (unlock func() error, err error) {
	l := flock.New(filepath.Join(os.TempDir(), fmt.Sprintf("berth-torture-%d-%d.lock", r.First, r.Last)))
	ok, err := l.TryLock()
	if err != nil {
		return nil, fmt.Errorf("torture: lock %s: %w", l.Path(), err)
	}
	if ok {
		return l.Unlock, nil
	}
	say(progress, "waiting for another torture run on %s to end", r)
	if _, err := l.TryLockContext(ctx, 50*time.Millisecond); err != nil {
		return nil, fmt.Errorf("torture: wait for another run on %s (%s): %w", r, l.Path(), err)
	}
	return l.Unlock, nil
}

// hostName is the fleet name (Config.Host) of the host of index i.
func hostName(i int) string { return fmt.Sprintf("host-%d", i+1) }

// retireHost retires host from the host by, through pgstore's public
// API (what berth host retire --force calls), and returns the rows it
// deleted. The host's processes were all killed just before, but its
// lease still runs: the retirement is forced, as an operator who has just
// taken a host down forces it.
func retireHost(ctx context.Context, dsn, by, host string, timeout time.Duration) (int, error) {
	st, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: by, Timeout: timeout, SweepInterval: -1, LeaseTTL: -1})
	if err != nil {
		return 0, fmt.Errorf("torture: retire %s: %w", host, err)
	}
	defer func() { _ = st.Close() }() //nolint:contextcheck // Close ends the session on a context of its own, within the store's timeout
	n, err := st.Retire(ctx, host, pgstore.RetireOptions{Force: true})
	if err != nil {
		return 0, fmt.Errorf("torture: retire %s: %w", host, err)
	}
	return n, nil
}

// holdClock keeps, for a run on PostgreSQL, every program that steps the
// system clock through internal/clocklock (another torture run with
// -clock-step, a test) from doing so while the run lasts: the server
// judges host leases and fleet-wide leases by its own clock, the one of
// this machine, and a step of 300 s ends every lease at once, which hands
// the leased ports out again under holders the run has no say over. It
// waits, as long as ctx allows, for such a program to finish, and returns
// the function that lets go.
func holdClock(ctx context.Context, progress io.Writer) (unlock func() error, err error) {
	quick, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	unlock, err = clocklock.Lock(quick)
	cancel()
	if err == nil {
		return unlock, nil
	}
	say(progress, "waiting for a program that steps the clock to finish (%s): the server's leases follow the clock", clocklock.Path)
	if unlock, err = clocklock.Lock(ctx); err != nil {
		return nil, fmt.Errorf("torture: -store: %w", err)
	}
	return unlock, nil
}
