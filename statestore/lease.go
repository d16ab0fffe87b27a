package statestore

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/store"
)

// A lease's row holds the holder's name in owner_name and the lease's end
// in lease_until, on the lease clock (owner.LeaseNow) of the boot and time
// namespace its owner_scope names; its other owner columns are
// owner.LeaseIdentity's, which berths from before schema 6 keep as a
// process that lives as long as the boot. This berth judges the row by
// lease_until alone, and reads it as store.Owner{Holder: name}.

// leaseGrant is a lease about to be granted or renewed.
type leaseGrant struct {
	holder  string
	until   int64     // lease clock
	expires time.Time // with a monotonic reading: see store.Reservation.Expires
}

// grant returns nil for a process's reservation (no holder).
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

// stored returns the owner columns of g's rows.
func (g *leaseGrant) stored() store.Owner {
	id := owner.LeaseIdentity(g.holder)
	return store.Owner{PID: id.PID, Start: id.Start, Namespace: id.Scope, Name: id.Name}
}

// leaseRow turns r, read from a row whose lease ends at until, into the holder's.
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

// extend moves the end of r, a live lease of g's holder, to g's.
func (s *sqlStore) extend(ctx context.Context, r store.Reservation, g *leaseGrant) (store.Reservation, error) {
	args := append(append([]any{g.until}, keyArgs(r.Key)...), g.stored().Namespace, g.holder)
	if _, err := s.st.exec(ctx, qRenewKey, args...); err != nil {
		return store.Reservation{}, storageErr("renew "+r.String(), err)
	}
	s.cache.stale()
	r.Expires = g.expires
	return r, nil
}

const (
	// A lease's rows are those of its holder's name and of this boot's and
	// namespaces' lease scope.
	leaseMatch = "lease_until <> 0 AND owner_scope = ? AND owner_name = ?"
	qRenewKey  = "UPDATE port_allocations SET lease_until = ? WHERE protocol = ? AND port = ? AND address = ? AND " + leaseMatch
	// qRenew extends only leases that have not ended: one that has may
	// stand for a port another owner took since (its row reaped).
	qRenew = "UPDATE port_allocations SET lease_until = ? WHERE lease_until > ? AND " + leaseMatch
)

func (s *sqlStore) Renew(ctx context.Context, holder string, ttl time.Duration) (int, error) {
	if holder == "" { // Owner{}.Validate would judge it as a process
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
	n, err := s.exec(ctx, op, func(int64) { s.cache.stale() }, qRenew, g.until, now, g.stored().Namespace, holder)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("%s: %w: it holds no reservation whose lease has not ended; get the ports again", op, store.ErrNotFound)
	}
	return int(n), nil
}
