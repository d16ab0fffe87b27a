// Package fleet opens a fleet's PostgreSQL store (package pgstore) for
// portalloc, so that the hosts of a fleet share one range without ever
// granting a port twice on one host.
//
// It is the one package a program imports to use a Config.StoreDSN (or
// BERTH_STORE): portalloc itself links no PostgreSQL client, and neither
// do porttest nor statestore, so a program that does not ask for
// PostgreSQL does not build or link pgx. The split is database/sql's: the
// dispatcher talks to the interfaces of package store, and the driver is
// linked by the program that wants it.
//
//	cfg, err := portalloc.ConfigFromEnv() // BERTH_STORE, BERTH_HOST, ...
//	...
//	a, err := fleet.New(ctx, cfg) // the PostgreSQL store of cfg.StoreDSN, else the SQLite one
//
// New and OpenStore take any Config: without a Store, New does what
// portalloc.New does, and OpenStore opens the SQLite store of the
// Config's state directory.
//
// # Fleet-wide reservations
//
// An Allocator on a fleet's store also serves owners that are not
// processes of a host: a pod not yet scheduled, a job. Reserve reserves a
// port of a band of the caller's own that is free on every host, for a
// named holder under a lease on the server's clock; ReserveSet reserves
// the ports of a portset.SetSpec so, all or none. The holder's controller
// renews the leases (Renew), gives a reservation its host once that is
// known (Narrow) and releases it (Release); Leases lists them. Such a
// reservation is the holder's, not the process's: the Allocator's Close
// leaves it, and a lease that runs out is reaped by any host. They reach
// the store through its store.FleetStore interface; on the SQLite store
// they return a *portalloc.FieldError for Config.StoreDSN.
//
// Importing fleet has no side effects: it registers nothing.
package fleet

import (
	"context"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// New returns an Allocator for cfg, as portalloc.New does, reserving in
// the PostgreSQL store cfg.StoreDSN names when it names one (see
// portalloc.Config.StoreDSN): it validates cfg, opens the store within
// cfg.Timeout, and fails with an error wrapping
// portalloc.ErrStoreUnavailable when it cannot (a fleet's store never
// falls back to the MRU file). The fleet-wide calls (Reserve, ...) use
// the store as a store.FleetStore.
func New(ctx context.Context, cfg portalloc.Config) (*portalloc.Allocator, error) {
	return core.NewWithOpener(ctx, cfg, open)
}

// OpenStore opens the store cfg names, for a program that reads or
// changes its rows directly, as berth's ls, reap, release and transfer
// do: the PostgreSQL database of cfg.StoreDSN, or else the SQLite file in
// cfg.StateDir (created if missing; with an empty StateDir, the default,
// after taking over a store left at the previous default, as
// portalloc.New does). The store runs no background sweep, and a busy
// SQLite store is waited for up to cfg.Timeout. It never falls back: an
// error is the store's. The caller closes the store.
func OpenStore(ctx context.Context, cfg portalloc.Config) (store.Store, error) {
	s, err := core.OpenStoreWith(ctx, cfg, open)
	return s, opError("", err)
}

// open opens the PostgreSQL store cfg.StoreDSN names, as this host
// (cfg.Host), with cfg.Logger and cfg.Timeout: what New and OpenStore
// hand to portalloc to open a Config.StoreDSN. cfg.StoreDSN is a connection string or
// the absolute path of the directory of the server's unix socket; any
// other value, the empty one included, is a *portalloc.FieldError for
// Config.StoreDSN that never shows its password. A tool's store
// runs no background sweep.
func open(ctx context.Context, cfg portalloc.Config, tool bool) (store.Store, error) {
	conn, err := dsn.FromStore(cfg.StoreDSN)
	if err != nil || cfg.StoreDSN == "" {
		want := "a PostgreSQL connection string or the absolute path of the directory of its unix socket"
		if err != nil {
			want += " (" + err.Error() + ")"
		}
		return nil, &portalloc.FieldError{Field: "Config.StoreDSN", Value: dsn.Redact(cfg.StoreDSN), Want: want}
	}
	po := pgstore.Options{Host: cfg.Host, Logger: cfg.Logger, Timeout: cfg.Timeout}
	if tool {
		po.SweepInterval = -1
	}
	s, err := pgstore.Open(ctx, conn, po)
	if err != nil {
		return nil, err
	}
	return s, nil
}
