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
// process). It returns an error wrapping store.ErrNotFound when own holds
// no such row.
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
// another, a live process of this host. It returns an error wrapping
// store.ErrNotFound when from holds no such row.
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
	// The row is to's now: this Store no longer speaks for it.
	s.book.drop(key, from)
	return nil
}

// List returns this host's reservations that match f, ordered by
// protocol, port and address (IPv4 before IPv6), rows of exited owners
// included until they are reaped. It shows the rows of processes only, as
// store.Store promises: lease rows are listed by Leases.
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
	rows, err := s.queryRows(ctx, s.open, "list", q, args...)
	if err != nil {
		return nil, err
	}
	var out []store.Reservation
	for _, r := range rows {
		out = append(out, r.Reservation)
	}
	return out, nil
}

// Reap deletes this host's reservations whose owners have exited, the
// reservations of other hosts whose lease ended more than Options.ReapAfter
// ago by the server's clock, and the lease rows whose lease has run out,
// and returns how many it deleted.
//
// A dead owner never comes back, so no recheck is needed between reading
// this host's owners and deleting the rows of the dead.
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
		// Errors are only logged: the gate does not count ended sessions.
		if _, err := s.exec(ctx, "reap ended sessions", qReapSessions); err != nil && ctx.Err() == nil {
			s.log.V(1).Info("could not delete ended sessions", "error", err.Error())
		}
	}
	return n + int(m) + int(l), err
}

func (s *Store) reapOwn(ctx context.Context) (int, error) {
	owners, err := query(ctx, s, s.open, "reap", func(r pgx.CollectableRow) (store.Owner, error) {
		var o store.Owner
		err := r.Scan(&o.PID, &o.Start, &o.Namespace)
		return o, err
	}, qOwners, s.hostNo())
	if err != nil {
		return 0, err
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

// pruneStickyEvery is how many Remember calls pass between two prunes.
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

// Renew refuses: a fleet's named holders renew with RenewFleet.
func (s *Store) Renew(_ context.Context, holder string, _ time.Duration) (int, error) {
	return 0, noHolder(store.Owner{Holder: holder})
}
