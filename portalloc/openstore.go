package portalloc

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// OpenStore opens the store cfg names, for a program that reads or changes
// its rows directly, as berth's ls, reap, release and transfer do: the
// PostgreSQL database of cfg.Store, or else the SQLite file in
// cfg.StateDir (created if missing). The store runs no background sweep,
// and a busy SQLite store is waited for up to cfg.Timeout. It never falls
// back: an error is the store's. The caller closes the store.
func OpenStore(ctx context.Context, cfg Config) (store.Store, error) {
	defaulted := cfg.StateDir == "" && cfg.Store == ""
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if defaulted {
		if err := takeOver(ctx, cfg.StateDir, cfg.Logger, cfg.Timeout); err != nil {
			return nil, fmt.Errorf("portalloc: %w", err)
		}
	}
	return openBacking(ctx, cfg, true)
}

// openBacking opens the store cfg names; a tool's store sweeps nothing and
// waits for a busy SQLite store as long as cfg.Timeout allows.
func openBacking(ctx context.Context, cfg Config, tool bool) (store.Store, error) {
	if cfg.Store != "" {
		dsn, err := storeDSN(cfg.Store)
		if err != nil {
			return nil, err
		}
		opts := pgstore.Options{Host: cfg.Host, Logger: cfg.Logger, Timeout: cfg.Timeout}
		if tool {
			opts.SweepInterval = -1
		}
		s, err := pgstore.Open(ctx, dsn, opts)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	// A store locked by something else for half the allocation timeout
	// is busy: the caller gets an error wrapping ErrStoreUnavailable.
	opts := statestore.Options{Logger: cfg.Logger, BusyTimeout: min(cfg.Timeout/2, maxBusyWait)}
	if tool {
		opts.SweepInterval, opts.BusyTimeout = -1, cfg.Timeout
	}
	s, err := statestore.Open(ctx, filepath.Join(cfg.StateDir, DatabaseFile), opts)
	if err != nil {
		return nil, err
	}
	return s, nil
}
