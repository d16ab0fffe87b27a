package statestore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/store"
)

// Leases: a reservation can belong to a named holder under a lease instead
// of a process (store.LeaseStore), e.g. a CI job's port that must outlive
// the shell that asked for it.
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
// table show the holder as Owner{Scope: store.LeaseScope, Name: holder},
// with Expires set.

// Lease asks for a reservation held by a named holder (see store.Lease).
type Lease = store.Lease

var _ store.LeaseStore = (*Store)(nil)

// leaseGrant is a lease about to be granted or renewed: its holder and its
// end, on the lease clock and on this process's clock.
type leaseGrant struct {
	holder  string
	until   int64     // lease clock
	expires time.Time // with a monotonic reading: see store.Reservation.Expires
}

// grant checks l and reads the clock for it.
func grant(l Lease) (*leaseGrant, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	now, err := owner.LeaseNow()
	if err != nil {
		return nil, storageErr("lease", err)
	}
	return &leaseGrant{holder: l.Holder, until: now + int64(l.TTL), expires: time.Now().Add(l.TTL)}, nil
}

// owner returns the owner of the reservation: the holder under g, or,
// when g is nil, o (a process, zero for this one).
func (g *leaseGrant) owner(o Owner) Owner {
	if g == nil {
		return o
	}
	return Owner{Scope: store.LeaseScope, Name: g.holder}
}

// stored returns the owner columns of g's rows (see the comment above).
func (g *leaseGrant) stored() Owner {
	return fromIdentity(owner.LeaseIdentity(g.holder))
}

// leaseRow turns r, read from a row whose lease ends at until, into the
// holder's reservation: its owner the holder, its Expires set.
func leaseRow(r *Reservation, until int64) {
	left, known := owner.LeaseRemaining(r.Owner.Scope, until)
	r.Owner = Owner{Scope: store.LeaseScope, Name: r.Owner.Name}
	if known {
		r.Expires = time.Now().Add(left)
	}
}

// noOwner refuses an owner in a request for a holder.
func noOwner(o Owner) error {
	if !o.IsZero() {
		return &FieldError{Field: "owner", Value: o.String(), Want: "no owner: a lease's reservation belongs to its holder"}
	}
	return nil
}

// ReserveLease reserves req.Key for l.Holder under a lease of l.TTL (see
// store.LeaseStore). The reservation outlives the process that asked; it
// ends with ReleaseLease, or once its lease has ended (after l.TTL unless
// RenewLease extends it, or with the boot) by reaping. req.Owner must be
// zero.
func (s *Store) ReserveLease(ctx context.Context, req Request, l Lease) (Reservation, error) {
	if err := noOwner(req.Owner); err != nil {
		return Reservation{}, err
	}
	g, err := grant(l)
	if err != nil {
		return Reservation{}, err
	}
	return s.reserve(ctx, req, g)
}

// ScanLease is Scan for l.Holder under a lease of l.TTL (see ReserveLease).
func (s *Store) ScanLease(ctx context.Context, req ScanRequest, l Lease) (Reservation, error) {
	if err := noOwner(req.Owner); err != nil {
		return Reservation{}, err
	}
	g, err := grant(l)
	if err != nil {
		return Reservation{}, err
	}
	return s.scan(ctx, req, g)
}

// extend sets the lease of r, a live lease of g's holder, to g's end.
func (s *Store) extend(ctx context.Context, r Reservation, g *leaseGrant) (Reservation, error) {
	packed, _ := netaddr.Pack(r.Addr) // read from the table: already normal
	if _, err := s.conn.ExecContext(ctx, qRenewKey, g.until, string(r.Protocol), int(r.Port), packed, g.stored().Scope, g.holder); err != nil {
		return Reservation{}, storageErr("renew "+r.String(), err)
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

// RenewLease sets the lease of every reservation of holder whose lease has
// not ended to ttl from now, and returns how many there are (see
// store.LeaseStore). A holder with none is an error wrapping ErrNotFound.
func (s *Store) RenewLease(ctx context.Context, holder string, ttl time.Duration) (int, error) {
	g, err := grant(Lease{Holder: holder, TTL: ttl})
	if err != nil {
		return 0, err
	}
	now := g.until - int64(ttl)
	n, err := s.writeN(ctx, "renew the leases of holder "+quoteHolder(holder), qRenew, g.until, now, g.stored().Scope, holder)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("renew the leases of holder %s: %w: it holds no reservation whose lease has not ended; get the ports again", quoteHolder(holder), ErrNotFound)
	}
	return int(n), nil
}

// ReleaseLease deletes the reservations of holder that match f and
// returns how many (see store.LeaseStore); leases that have ended but are
// not yet reaped count too. f.OwnerPID must be 0.
func (s *Store) ReleaseLease(ctx context.Context, holder string, f Filter) (int, error) {
	if err := store.CheckHolder(holder); err != nil {
		return 0, err
	}
	if f.OwnerPID != 0 {
		return 0, &FieldError{Field: "owner", Value: fmt.Sprint(f.OwnerPID), Want: "no owner pid: a lease's reservation belongs to its holder"}
	}
	where := []string{leaseMatch}
	args := []any{owner.LeaseIdentity(holder).Scope, holder}
	if f.Protocol != "" {
		if !f.Protocol.Valid() {
			return 0, &FieldError{Field: "protocol", Value: string(f.Protocol), Want: `"tcp" or "udp"`}
		}
		where, args = append(where, "protocol = ?"), append(args, string(f.Protocol))
	}
	if f.Port != 0 {
		where, args = append(where, "port = ?"), append(args, int(f.Port))
	}
	if f.Label != "" {
		where, args = append(where, "label = ?"), append(args, f.Label)
	}
	op := "release the reservations of holder " + quoteHolder(holder)
	n, err := s.writeN(ctx, op, "DELETE FROM port_allocations WHERE "+strings.Join(where, " AND "), args...)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return int(n), nil
}

func quoteHolder(h string) string { return fmt.Sprintf("%q", h) }

// writeN runs the write statement q, rare enough not to be kept prepared,
// in a write transaction and returns how many rows it changed.
func (s *Store) writeN(ctx context.Context, op, q string, args ...any) (int64, error) {
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
