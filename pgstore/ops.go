package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/store"
)

// Release deletes own's reservation of key on this host (zero own: this
// process), in one round trip. It returns an error wrapping
// store.ErrNotFound when own holds no such row; another owner's row is
// never touched.
func (s *Store) Release(ctx context.Context, key store.Key, own store.Owner) error {
	key, own, err := s.validate(key, own)
	if err != nil {
		return err
	}
	op := "release " + key.String()
	s.book.release(store.Reservation{Key: key, Owner: own}) // before the delete
	n, err := s.exec(ctx, op, qDeleteOwned, s.keyArgs(key, own)...)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w for %s", op, store.ErrNotFound, own)
	}
	return nil
}

// Transfer hands the reservation of key on this host from one owner to
// another, e.g. from an orchestrator to the child it started, in one
// round trip. to must be a live process of this host. It returns an error
// wrapping store.ErrNotFound when from holds no such row.
func (s *Store) Transfer(ctx context.Context, key store.Key, from, to store.Owner) error {
	key, from, err := s.validate(key, from)
	if err != nil {
		return err
	}
	if err := to.Validate(); err != nil {
		return err
	}
	if err := noHolder(to); err != nil {
		return err
	}
	if !to.Alive(ctx) {
		return &store.FieldError{Field: "owner", Value: to.String(), Want: "a running process"}
	}
	op := "transfer " + key.String()
	n, err := s.exec(ctx, op, qTransfer, append(s.keyArgs(key, from), to.PID, to.Start, to.Namespace, to.Name)...)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w for %s", op, store.ErrNotFound, from)
	}
	// The row is to's now, and this Store no longer speaks for it (see
	// the package doc's grace period).
	s.book.drop(key, from)
	return nil
}

// List returns this host's reservations that match f, ordered by
// protocol, port and address (IPv4 before IPv6). Rows of exited owners are
// included until they are reaped: use Owner.Alive to tell them apart.
//
// List shows the rows of processes only, as store.Store promises: lease
// rows, fleet-wide or narrowed to this host, are listed by Leases. Their
// ports are taken all the same.
func (s *Store) List(ctx context.Context, f store.Filter) ([]store.Reservation, error) {
	where := []string{"host_no = $1", "owner_kind = 'process'"}
	args := []any{s.hostNo()}
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, cond+" = $"+strconv.Itoa(len(args)))
	}
	if f.Protocol != "" {
		if f.Protocol != store.TCP && f.Protocol != store.UDP {
			return nil, &store.FieldError{Field: "protocol", Value: string(f.Protocol), Want: `"tcp" or "udp"`}
		}
		add("protocol", string(f.Protocol))
	}
	if f.Port != 0 {
		add("port", int32(f.Port))
	}
	if f.Label != "" {
		add("label", f.Label)
	}
	if f.OwnerPID != 0 {
		add("owner_pid", f.OwnerPID)
	}
	q := "SELECT " + rowColumns + " FROM berth_port_allocations WHERE " + strings.Join(where, " AND ") +
		" ORDER BY protocol, port, address"
	if err := s.open(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	if f.Holder != "" {
		return nil, nil // no process row is a named holder's
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	rows, err := s.pool.Query(cctx, q, args...)
	if err != nil {
		return nil, s.fail(ctx, "list", err)
	}
	defer rows.Close()
	var out []store.Reservation
	for rows.Next() {
		r, err := scanRow(rows, nil, nil)
		if err != nil {
			return nil, s.fail(ctx, "list", err)
		}
		out = append(out, r.Reservation)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, "list", err)
	}
	return out, nil
}

// Reap deletes this host's reservations whose owners have exited, the
// reservations of other hosts whose lease ended more than Options.ReapAfter
// ago by the server's clock, and the lease rows of any host or of the
// whole fleet whose lease has run out (see ReserveFleet), and returns how
// many it deleted.
//
// For this host, one round trip reads the host's owners, liveness is
// judged here, and one more deletes the rows of the dead. A dead owner
// never comes back, so no recheck is needed between the two. Other hosts'
// rows go in one transaction (see reapLapsed).
func (s *Store) Reap(ctx context.Context) (int, error) {
	n, err := s.reapOwn(ctx)
	if err != nil {
		return n, err
	}
	m, err := s.reapLapsed(ctx)
	if err != nil {
		return n + int(m), err
	}
	l, err := s.reapLeases(ctx)
	if err == nil {
		s.reapSessions(ctx)
	}
	return n + int(m) + int(l), err
}

// reapOwn deletes this host's reservations whose owners have exited.
func (s *Store) reapOwn(ctx context.Context) (int, error) {
	if err := s.open(); err != nil {
		return 0, fmt.Errorf("reap: %w", err)
	}
	cctx, cancel := s.call(ctx)
	rows, err := s.pool.Query(cctx, qOwners, s.hostNo())
	if err != nil {
		cancel()
		return 0, s.fail(ctx, "reap", err)
	}
	owners, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Owner, error) {
		var o store.Owner
		err := r.Scan(&o.PID, &o.Start, &o.Namespace)
		return o, err
	})
	cancel()
	if err != nil {
		return 0, s.fail(ctx, "reap", err)
	}
	var (
		pids   []int32
		starts []int64
		scopes []string
	)
	for _, o := range owners {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if !o.Alive(ctx) {
			pids, starts, scopes = append(pids, int32(o.PID)), append(starts, o.Start), append(scopes, o.Namespace)
		}
	}
	if len(pids) == 0 {
		return 0, nil
	}
	n, err := s.exec(ctx, "reap", qReapOwners, s.hostNo(), pids, starts, scopes)
	if err != nil {
		return 0, err
	}
	s.reaped.Add(n)
	if n > 0 {
		s.log.Info("reaped reservations of exited owners", "rows", n, "owners", len(pids))
	}
	return int(n), nil
}

// pruneStickyEvery is how many Remember calls of a Store pass between two
// prunes.
const pruneStickyEvery = 256

// Remember records port as the last one handed out on this host under
// label for protocol, for Recall after a restart.
func (s *Store) Remember(ctx context.Context, label string, protocol store.Protocol, port uint16) error {
	if label == "" {
		return &store.FieldError{Field: "label", Value: "", Want: "a non-empty label to remember the port under"}
	}
	if err := store.CheckLabel(label); err != nil {
		return err
	}
	if protocol != store.TCP && protocol != store.UDP {
		return &store.FieldError{Field: "protocol", Value: string(protocol), Want: `"tcp" or "udp"`}
	}
	if port == 0 {
		return &store.FieldError{Field: "port", Value: "0", Want: "a port from 1 to 65535"}
	}
	if _, err := s.exec(ctx, "remember "+label, qRemember, s.hostNo(), label, string(protocol), int32(port)); err != nil {
		return err
	}
	if s.remembered.Add(1)%pruneStickyEvery == 0 {
		_, err := s.exec(ctx, "forget old sticky ports", qPruneSticky, s.hostNo(), store.MaxSticky)
		return err
	}
	return nil
}

// Recall returns the port last remembered on this host under label for
// protocol, and false when there is none.
func (s *Store) Recall(ctx context.Context, label string, protocol store.Protocol) (uint16, bool, error) {
	if err := s.open(); err != nil {
		return 0, false, fmt.Errorf("recall: %w", err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	var port int32
	err := s.pool.QueryRow(cctx, qRecall, s.hostNo(), label, string(protocol)).Scan(&port)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, s.fail(ctx, "recall "+label, err)
	case port < 1 || port > 65535:
		return 0, false, nil
	}
	return uint16(port), true, nil
}

// Renew refuses: a fleet's named holders reserve fleet-wide, and renew
// with RenewFleet.
func (s *Store) Renew(_ context.Context, holder string, _ time.Duration) (int, error) {
	return 0, noHolder(store.Owner{Holder: holder})
}
