// Package fleet opens a fleet's PostgreSQL store (package pgstore) for
// portalloc, so that the hosts of a fleet share one range without ever
// granting a port twice on one host.
//
// It is the one package a program imports to use a Config.StoreDSN (or
// BERTH_STORE): portalloc itself links no PostgreSQL client, so a program
// that does not ask for PostgreSQL does not build or link pgx.
//
//	a, err := fleet.New(ctx, portalloc.Config{}) // BERTH_STORE's PostgreSQL store, else the SQLite one
//
// # Fleet-wide reservations
//
// Owners that are not processes of a host (a pod not yet scheduled, a
// job) reserve through the store itself: Open, then pgstore.Store's
// ReserveFleet, ReserveFleetSet with SetRequests, RenewFleet, NarrowFleet,
// ReleaseFleet and Leases.
//
// Importing fleet has no side effects: it registers nothing.
package fleet

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// New returns an Allocator for cfg, as portalloc.New does, reserving in
// the PostgreSQL store that cfg.StoreDSN (or BERTH_STORE, unless
// cfg.IgnoreEnv) names, as the host cfg.Host (or BERTH_HOST, else the
// hostname); without a store named it is portalloc.New. The Allocators of
// a process with one StoreDSN share one store, which never falls back to
// the MRU file: one that cannot be opened or used is an error wrapping
// store.ErrUnavailable.
func New(ctx context.Context, cfg portalloc.Config) (*portalloc.Allocator, error) {
	if cfg.StoreDSN == "" && !cfg.IgnoreEnv {
		cfg.StoreDSN = os.Getenv("BERTH_STORE")
	}
	if cfg.StoreDSN == "" {
		return portalloc.New(ctx, cfg)
	}
	return portalloc.NewWithStore(ctx, cfg, func(ctx context.Context, cfg portalloc.Config) (store.Store, error) {
		st, err := open(ctx, cfg)
		if err != nil {
			return nil, err // a nil *pgstore.Store is no nil store.Store
		}
		return st, nil
	})
}

// Open opens the PostgreSQL store cfg.StoreDSN names (or BERTH_STORE, as
// for New), as the host cfg.Host, with cfg.Logger and cfg.Timeout, for
// the caller to close. A Config without a store is a *store.FieldError for
// Config.StoreDSN.
func Open(ctx context.Context, cfg portalloc.Config) (*pgstore.Store, error) {
	if cfg.StoreDSN == "" && !cfg.IgnoreEnv {
		cfg.StoreDSN = os.Getenv("BERTH_STORE")
	}
	if cfg.Host == "" && !cfg.IgnoreEnv {
		cfg.Host = os.Getenv("BERTH_HOST")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = portalloc.DefaultTimeout
	}
	s, err := open(ctx, cfg)
	if err != nil {
		return nil, opError(err)
	}
	return s, nil
}

func open(ctx context.Context, cfg portalloc.Config) (*pgstore.Store, error) {
	conn, err := dsn.FromStore(cfg.StoreDSN)
	if err != nil || cfg.StoreDSN == "" {
		want := "a PostgreSQL connection string or the absolute path of the directory of its unix socket"
		if err != nil {
			want += " (" + err.Error() + ")"
		}
		return nil, &store.FieldError{Field: "Config.StoreDSN", Value: dsn.Redact(cfg.StoreDSN), Want: want}
	}
	return pgstore.Open(ctx, conn, pgstore.Options{Host: cfg.Host, Logger: cfg.Logger, Timeout: cfg.Timeout})
}

// SetRequests returns the requests that reserve every port of spec
// fleet-wide for holder, under a lease of ttl (zero:
// pgstore.DefaultFleetTTL), for pgstore.Store.ReserveFleetSet: one per
// port, in spec order (groups, then each group's ports, a port of each
// member once per member), labelled as portset.Allocate labels them. The
// ports that are not fixed are drawn from band. A port's zero Addr is
// 0.0.0.0. Prefer, Order and Sticky are refused, as is a set of more than
// pgstore.MaxFleetSet ports or a spec that is not valid.
func SetRequests(spec portset.SetSpec, band store.Range, holder string, ttl time.Duration) ([]pgstore.FleetRequest, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	var reqs []pgstore.FleetRequest
	for gi, g := range spec.Groups {
		for pi, p := range g.Ports {
			field := fmt.Sprintf("groups[%d].ports[%d]", gi, pi)
			refuse := func(at, value, want string) error {
				return opError(&store.FieldError{Field: "SetSpec", Value: value, At: field + at, Want: want})
			}
			switch {
			case len(p.Prefer) > 0:
				return nil, refuse(".prefer", fmt.Sprint(p.Prefer), "none in a fleet-wide set, which draws its ports from the band: prefer is for a host's range")
			case p.Order != "":
				return nil, refuse(".order", string(p.Order), "none in a fleet-wide set, which draws its ports from the band: order is for a host's range")
			case p.Sticky:
				return nil, refuse(".sticky", "true", "false in a fleet-wide set, which has no host to remember its ports on: sticky is for a host's range")
			}
			b := band
			if p.Port != 0 {
				b = store.Range{First: p.Port, Last: p.Port}
			}
			proto := p.Protocol
			if proto == "" {
				proto = store.TCP
			}
			one := func(label string) {
				reqs = append(reqs, pgstore.FleetRequest{Protocol: proto, Addr: p.Addr, Band: b, Holder: holder, Label: label, TTL: ttl})
			}
			if p.Shared {
				one(spec.Name + "/" + g.Name + "/" + p.Name)
			} else {
				for m := range max(g.Members, 1) {
					one(fmt.Sprintf("%s/%s/%d/%s", spec.Name, g.Name, m, p.Name))
				}
			}
			if len(reqs) > pgstore.MaxFleetSet {
				return nil, refuse("", p.Name, fmt.Sprintf("at most %d ports reserved fleet-wide in a set (pgstore.MaxFleetSet); this port brings them to %d", pgstore.MaxFleetSet, len(reqs)))
			}
		}
	}
	return reqs, nil
}

// opError puts portalloc's prefix on an error of this package's public
// calls, once.
func opError(err error) error { return &portalloc.OpError{Err: err} }
