package portalloc

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// opener opens the store a Config.StoreDSN names: package
// github.com/berth-go/berth/portalloc/fleet hands portalloc the one of a
// fleet's PostgreSQL store (through package seam), so that only a program
// that asks for PostgreSQL links a client of it. cfg is the Config as New
// completed it (defaults filled in, StoreDSN checked); tool is true for a
// program that reads or changes the rows directly (berth ls, reap,
// release): the store then runs no sweep in the background and may wait up
// to Config.Timeout for a busy store. The store's errors are returned as
// they are: the caller wraps them in ErrStoreUnavailable.
type opener = func(ctx context.Context, cfg Config, tool bool) (store.Store, error)

// fleetPackage is the package that opens a Config.StoreDSN, for messages.
const fleetPackage = "github.com/berth-go/berth/portalloc/fleet"

// errNoOpener refuses the database s, set by the field named field
// (Config.StoreDSN or Config.Store), where no opener was given: portalloc
// does not link the PostgreSQL client it needs.
func errNoOpener(call, s, field string) error {
	return &FieldError{Field: field, Value: dsn.Redact(s),
		Want: fmt.Sprintf("no StoreDSN with portalloc.%s, which links no PostgreSQL client: import %q and call fleet.%s (it opens the PostgreSQL store Config.StoreDSN names), or leave StoreDSN empty for the SQLite store", call, fleetPackage, call)}
}

// OpenStore opens the SQLite store an Allocator of cfg would use, for a
// program that reads or changes its rows directly (PortOf, LivePorts,
// who.Lookup, a Reap of its own): the file in cfg.StateDir, created if
// missing, after taking over the previous default's when cfg.StateDir is
// empty. It runs no background sweep, waits up to cfg.Timeout for a busy
// store, and never falls back. The caller closes the store. A cfg.StoreDSN
// (a PostgreSQL database) is refused with a *FieldError for
// Config.StoreDSN (Config.Store when the deprecated name set it):
// fleet.OpenStore of package github.com/berth-go/berth/portalloc/fleet
// opens either.
func OpenStore(ctx context.Context, cfg Config) (store.Store, error) {
	s, err := openStoreWith(ctx, cfg, nil)
	return s, opError("", err)
}

// openStoreWith is fleet.OpenStore: it opens the store cfg names, for a
// program that reads or changes its rows directly, as berth's ls, reap,
// release and transfer do: the store cfg.StoreDSN names, through open, or
// else the SQLite file in cfg.StateDir (created if missing), after taking
// over the previous default's when cfg.StateDir is empty. The store runs
// no background sweep, and a busy SQLite store is waited for up to
// cfg.Timeout. It never falls back: an error is the store's. The caller
// closes the store.
func openStoreWith(ctx context.Context, cfg Config, open opener) (store.Store, error) {
	db, field, _ := cfg.storeSetting() // withDefaults refuses two databases
	if db != "" && open == nil {
		return nil, errNoOpener("OpenStore", db, field)
	}
	defaulted := cfg.StateDir == "" && db == ""
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if defaulted {
		if err := takeOver(ctx, cfg.StateDir, cfg.Logger, cfg.Timeout); err != nil {
			return nil, err
		}
	}
	return openBacking(ctx, cfg, open, true)
}

// openBacking opens the store cfg names: through open for a Config.StoreDSN,
// else the SQLite file in cfg.StateDir. A tool's store sweeps nothing and
// waits for a busy SQLite store as long as cfg.Timeout allows.
func openBacking(ctx context.Context, cfg Config, open opener, tool bool) (store.Store, error) {
	if cfg.StoreDSN != "" {
		if open == nil { // New refuses it before
			return nil, errNoOpener("New", cfg.StoreDSN, "Config.StoreDSN")
		}
		return open(ctx, cfg, tool)
	}
	// A store locked by something else for half the allocation timeout
	// is busy: the caller gets an error wrapping ErrStoreUnavailable.
	opts := statestore.Options{Logger: cfg.Logger, BusyTimeout: min(cfg.Timeout/2, maxBusyWait)}
	if tool {
		opts.SweepInterval, opts.BusyTimeout = -1, cfg.Timeout
	}
	s, err := statestore.Open(ctx, filepath.Join(cfg.StateDir, databaseFile), opts)
	if err != nil {
		return nil, err
	}
	return s, nil
}
