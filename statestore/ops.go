package statestore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berth-go/berth/store"
)

// Release releases a named holder's row whether or not its lease has ended.
func (s *sqlStore) Release(ctx context.Context, key store.Key, own store.Owner) error {
	key, own, err := s.validate(key, own)
	if err != nil {
		return err
	}
	q, args := qDeleteOwned, append(keyArgs(key), ownerArgs(own)...)
	if own.Holder != "" {
		q, args = qDeleteHeld, append(keyArgs(key), own.Holder)
	}
	n, err := s.exec(ctx, "release "+key.String(), func(int64) { s.cache.remove(key) }, q, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("release %s: %w for %s", key, store.ErrNotFound, own)
	}
	return nil
}

func (s *sqlStore) Transfer(ctx context.Context, key store.Key, from, to store.Owner) error {
	key, from, err := s.validate(key, from)
	if err != nil {
		return err
	}
	if err := to.Validate(); err != nil {
		return err
	}
	if to.Holder != "" || from.Holder != "" {
		return &store.FieldError{Field: "owner", Value: to.String(), Want: "a transfer from one process to another: a named holder's reservation is released and reserved anew"}
	}
	if !to.Alive(ctx) {
		return &store.FieldError{Field: "owner", Value: to.String(), Want: "a running process"}
	}
	args := append(append([]any{to.PID, to.Start, to.Namespace, to.Name}, keyArgs(key)...), ownerArgs(from)...)
	n, err := s.exec(ctx, "transfer "+key.String(), func(int64) { s.cache.stale() }, qTransfer, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("transfer %s: %w for %s", key, store.ErrNotFound, from)
	}
	return nil
}

// validate normalizes key and makes a zero own this process.
func (s *sqlStore) validate(key store.Key, own store.Owner) (store.Key, store.Owner, error) {
	key, err := key.Normalize()
	if err != nil {
		return store.Key{}, store.Owner{}, err
	}
	if own.IsZero() {
		own = s.self
	}
	return key, own, own.Validate()
}

func (s *sqlStore) List(ctx context.Context, f store.Filter) ([]store.Reservation, error) {
	if f.Protocol != "" && f.Protocol != store.TCP && f.Protocol != store.UDP {
		return nil, &store.FieldError{Field: "protocol", Value: string(f.Protocol), Want: `"tcp" or "udp"`}
	}
	var (
		where []string
		args  []any
	)
	for _, c := range []struct {
		set  bool
		cond string
		arg  any
	}{
		{f.Protocol != "", "protocol = ?", string(f.Protocol)},
		{f.Port != 0, "port = ?", int(f.Port)},
		{f.Label != "", "label = ?", f.Label},
		{f.OwnerPID != 0, "owner_pid = ? AND lease_until = 0", f.OwnerPID},
		{f.Holder != "", "lease_until <> 0 AND owner_name = ?", f.Holder},
	} {
		if c.set {
			where, args = append(where, c.cond), append(args, c.arg)
		}
	}
	q := "SELECT " + rowColumns + " FROM port_allocations"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY protocol, port, address"

	release, err := s.acquire(ctx, false)
	if err != nil {
		return nil, acquireErr("list", err)
	}
	defer release()
	out, err := s.rowsOf(ctx, nil, q, args...)
	if err != nil {
		return nil, storageErr("list", err)
	}
	return out, nil
}

// Reap checks liveness without the write lock (it reads the process
// table): a dead owner never comes back, so its rows can be deleted
// afterwards without a recheck.
func (s *sqlStore) Reap(ctx context.Context) (int, error) {
	owners, leases, err := s.owners(ctx)
	if err != nil {
		return 0, err
	}
	dead := map[ownerKey]bool{}
	for _, o := range owners {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if !o.Alive(ctx) {
			dead[ownerKey{o.PID, o.Start, o.Namespace}] = true
		}
	}
	if len(dead) == 0 && !leases {
		return 0, nil
	}
	var n int64
	err = s.write(ctx, "reap", func(tctx context.Context) error {
		// One pass over the table picks the rows; each is deleted by its key.
		doomed, err := s.rowsOf(tctx, func(r store.Reservation) bool {
			if r.Owner.Holder != "" {
				return !leaseLive(r)
			}
			return dead[ownerKey{r.Owner.PID, r.Owner.Start, r.Owner.Namespace}]
		}, qAll)
		if err != nil {
			return storageErr("reap", err)
		}
		for _, r := range doomed {
			if _, err := s.st.exec(tctx, qDeleteKey, keyArgs(r.Key)...); err != nil {
				return storageErr("reap "+r.String(), err)
			}
			n++
		}
		s.cache.stale()
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.reaped.Add(n)
	if n > 0 {
		s.log.Info("reaped reservations of exited owners and ended leases", "rows", n, "owners", len(dead))
	}
	return int(n), nil
}

// owners returns processOwners, and whether any row is under a lease.
func (s *sqlStore) owners(ctx context.Context) ([]store.Owner, bool, error) {
	release, err := s.acquire(ctx, false)
	if err != nil {
		return nil, false, acquireErr("reap", err)
	}
	defer release()
	out, err := s.processOwners(ctx)
	if err != nil {
		return nil, false, storageErr("reap", err)
	}
	var leases bool
	if err := s.st.row(ctx, qLeases).Scan(&leases); err != nil {
		return nil, false, storageErr("reap", err)
	}
	return out, leases, nil
}

// processOwners returns the distinct process owners of the table's rows, closed.
func (s *sqlStore) processOwners(ctx context.Context) ([]store.Owner, error) {
	rows, err := s.st.query(ctx, qOwners)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []store.Owner
	for rows.Next() {
		var o store.Owner
		if err := rows.Scan(&o.PID, &o.Start, &o.Namespace); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// firstSweep is how long after Open the first sweep runs at the latest. A
// process that lives less (`berth get`, a short test binary) never sweeps:
// its first port would otherwise wait for a pass over the whole table, and
// the rows in its way are reaped as it meets them anyway.
const firstSweep = time.Second

// sweep reaps after min(every, firstSweep) and then every interval until Close.
func (s *sqlStore) sweep(every time.Duration) {
	defer s.wg.Done()
	ctx := s.bg
	t := time.NewTimer(min(every, firstSweep))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Close ends a sweep in flight. A lost file is no failure of the
		// sweep: the store's owner learns of it at its next call, and
		// opens the store again.
		switch _, err := s.Reap(ctx); {
		case err == nil || ctx.Err() != nil || errors.Is(err, store.ErrClosed):
		case errors.Is(err, store.ErrLost):
			s.log.V(1).Info("no reaping sweep: the store's file was lost", "error", err.Error(), "in", every.String())
		default:
			s.log.Error(err, "background reaping sweep failed; it runs again", "in", every.String())
		}
		if err := s.pruneSticky(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrClosed) {
			s.log.V(1).Info("forgetting old sticky ports failed; it runs again", "in", every.String(), "error", err.Error())
		}
		t.Reset(every)
	}
}

// Stats takes no lock.
func (s *sqlStore) Stats() store.Stats {
	return store.Stats{Reaped: s.reaped.Load(), ProbeFailures: s.probeFailures.Load()}
}
