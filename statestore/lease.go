package statestore

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/store"
)

// Leases: a reservation can belong to a named holder under a lease instead
// of a process (an Owner with Holder set), e.g. a CI job's port that must
// outlive the shell that asked for it.
//
// Such a row holds the holder's name in owner_name and the end of its lease
// in lease_until: nanoseconds of the lease clock (CLOCK_BOOTTIME on Linux,
// see owner.LeaseNow) of the boot and time namespace its owner_scope names.
// owner_pid, owner_start and owner_scope are owner.LeaseIdentity's: pid 1
// of the writer's pid namespace with its start, and a scope ending in
// "/lease". A berth that knows no leases (a release from before schema
// version 6, still running) judges such a row as the row of a process that
// lives as long as the boot, and keeps it; this berth judges it by
// lease_until alone, so a lease ends on time, neither earlier nor later
// when the wall clock is stepped, and with its boot. Rows read from the
// table show the holder as store.Owner{Holder: name}, with Expires set.

// leaseGrant is a lease about to be granted or renewed: its holder and its
// end, on the lease clock and on this process's clock.
type leaseGrant struct {
	holder  string
	until   int64     // lease clock
	expires time.Time // with a monotonic reading: see store.Reservation.Expires
}

// grant reads the lease clock for a lease of holder that lasts ttl; nil for
// a process's reservation (no holder).
func grant(holder string, ttl time.Duration) (*leaseGrant, error) {
	if holder == "" {
		return nil, nil
	}
	now, err := owner.LeaseNow()
	if err != nil {
		return nil, storageErr("lease", err)
	}
	return &leaseGrant{holder: holder, until: now + int64(ttl), expires: time.Now().Add(ttl)}, nil
}

// stored returns the owner columns of g's rows (see the comment above).
func (g *leaseGrant) stored() store.Owner {
	id := owner.LeaseIdentity(g.holder)
	return store.Owner{PID: id.PID, Start: id.Start, Namespace: id.Scope, Name: id.Name}
}

// leaseRow turns r, read from a row whose lease ends at until, into the
// holder's reservation: its owner the holder, its Expires set.
func leaseRow(r *store.Reservation, until int64) {
	left, known := owner.LeaseRemaining(r.Owner.Namespace, until)
	r.Owner = store.Owner{Holder: r.Owner.Name}
	if known {
		r.Expires = time.Now().Add(left)
	}
}

// leaseLive reports whether r is a named holder's whose lease has not
// ended, by the process-local clock (see store.Reservation.Expires).
func leaseLive(r store.Reservation) bool {
	return r.Owner.Holder != "" && (r.Expires.IsZero() || time.Now().Before(r.Expires))
}

// extend sets the lease of r, a live lease of g's holder, to g's end.
func (s *sqlStore) extend(ctx context.Context, r store.Reservation, g *leaseGrant) (store.Reservation, error) {
	packed, _ := netaddr.Pack(r.Addr) // read from the table: already normal
	if _, err := s.conn.ExecContext(ctx, qRenewKey, g.until, string(r.Protocol), int(r.Port), packed, g.stored().Namespace, g.holder); err != nil {
		return store.Reservation{}, storageErr("renew "+r.String(), err)
	}
	s.cache.stale()
	r.Expires = g.expires
	return r, nil
}

// The statements of leases; a lease's rows are those of its holder's name
// and of this boot's and namespaces' lease scope.
const (
	leaseMatch = "lease_until <> 0 AND owner_scope = ? AND owner_name = ?"
	qRenewKey  = "UPDATE port_allocations SET lease_until = ? WHERE protocol = ? AND port = ? AND address = ? AND " + leaseMatch
	// qRenew extends only leases that have not ended: one that has may
	// stand for a port another owner took since (its row reaped).
	qRenew = "UPDATE port_allocations SET lease_until = ? WHERE lease_until > ? AND " + leaseMatch
)

// Renew sets the lease of every reservation of holder whose lease has not
// ended to ttl from now, and returns how many there are. A holder with none
// is an error wrapping store.ErrNotFound.
func (s *sqlStore) Renew(ctx context.Context, holder string, ttl time.Duration) (int, error) {
	if holder == "" {
		// Owner{}.Validate would judge it as a process.
		return 0, &store.FieldError{Field: "holder", Value: "", Want: "the name of the holder whose leases to renew"}
	}
	if err := (store.Owner{Holder: holder}).Validate(); err != nil {
		return 0, err
	}
	if err := store.CheckTTL(ttl); err != nil {
		return 0, err
	}
	g, err := grant(holder, ttl)
	if err != nil {
		return 0, err
	}
	op := fmt.Sprintf("renew the leases of holder %q", holder)
	now := g.until - int64(ttl)
	n, err := s.writeN(ctx, op, qRenew, g.until, now, g.stored().Namespace, holder)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("%s: %w: it holds no reservation whose lease has not ended; get the ports again", op, store.ErrNotFound)
	}
	return int(n), nil
}

// writeN runs the write statement q, rare enough not to be kept prepared,
// in a write transaction and returns how many rows it changed.
func (s *sqlStore) writeN(ctx context.Context, op, q string, args ...any) (int64, error) {
	var n int64
	err := s.write(ctx, op, func(tctx context.Context) error {
		res, err := s.conn.ExecContext(tctx, q, args...)
		if err != nil {
			return storageErr(op, err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return storageErr(op, err)
		}
		s.cache.stale()
		return nil
	})
	return n, err
}
