package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/store"
)

// Host leases. Every time below is the server's: each statement compares
// with now() in SQL and takes durations as milliseconds, so a client's
// clock or time zone decides nothing.
const (
	// qRegisterHost adds host $1 with a lease of $2 ms; qClaimHost renews it when known.
	qRegisterHost = "INSERT INTO berth_hosts (host_id, expires_at) VALUES ($1, now() + $2::bigint * interval '1 millisecond')" +
		" ON CONFLICT (host_id) DO NOTHING"
	// qClaimHost renews host $1's lease to $2 ms from now for the boot $3, never shortening it,
	// and reads and resets what other hosts left for it: the rows they deleted (lost_rows),
	// whether it was retired, and whether its lease had lapsed. The first CTE locks the host's
	// row, so a reaping or retirement that runs meanwhile is counted in this claim or the next.
	//
	// A lease that is live, not retired, and held by another boot (both known) belongs to
	// another machine under the same name: then nothing changes (taken), and the statement
	// returns that boot and its lease's ms left. The row lock serialises two machines' claims.
	qClaimHost = "WITH old AS (SELECT host_no, lost_rows, retired_at IS NOT NULL AS retired, expires_at < now() AS lapsed, boot_id," +
		" (retired_at IS NULL AND expires_at >= now() AND boot_id <> '' AND $3::text <> '' AND boot_id <> $3::text) AS taken," +
		" greatest(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint AS left_ms" +
		" FROM berth_hosts WHERE host_id = $1 FOR UPDATE)," +
		" renewed AS (UPDATE berth_hosts h SET expires_at = greatest(h.expires_at, now() + $2::bigint * interval '1 millisecond')," +
		" retired_at = NULL, lost_rows = 0, boot_id = CASE WHEN $3::text = '' THEN h.boot_id ELSE $3::text END" +
		" FROM old WHERE h.host_no = old.host_no AND NOT old.taken RETURNING h.host_no)" +
		" SELECT host_no, lost_rows, retired, lapsed, taken, boot_id, left_ms, " + qGuarded + " FROM old"

	// qLapsedHosts locks the other hosts ($1 is this one) that hold rows
	// and whose lease ended more than $2 ms ago. FOR UPDATE rechecks the
	// lease on the newest row version, and holds off the host's inserts
	// (their foreign key check) and renewals until the transaction ends.
	qLapsedHosts = "SELECT host_no FROM berth_hosts h" +
		" WHERE host_no <> $1 AND expires_at + $2::bigint * interval '1 millisecond' < now()" +
		" AND EXISTS (SELECT 1 FROM berth_port_allocations p WHERE p.host_no = h.host_no AND p.owner_kind = 'process')" +
		" ORDER BY host_no FOR UPDATE"
	// qReapHosts deletes the process rows of the hosts $1 and adds their
	// number to each host's lost_rows.
	qReapHosts = "WITH gone AS (DELETE FROM berth_port_allocations WHERE host_no = ANY($1::int[]) AND owner_kind = 'process' RETURNING host_no)," +
		" n AS (SELECT host_no, count(*) AS n FROM gone GROUP BY host_no)" +
		" UPDATE berth_hosts h SET lost_rows = h.lost_rows + n.n FROM n WHERE h.host_no = n.host_no" +
		" RETURNING h.host_id, n.n"

	// qLockHost locks host $1's row for its retirement and reads its lease.
	qLockHost = "SELECT host_no, expires_at >= now(), expires_at," +
		" greatest(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint" +
		" FROM berth_hosts WHERE host_id = $1 FOR UPDATE"
	// qRetireHost deletes every process row and sticky port of host $1
	// and marks it retired, adding the rows to its lost_rows.
	qRetireHost = "WITH gone AS (DELETE FROM berth_port_allocations WHERE host_no = $1 AND owner_kind = 'process' RETURNING 1)," +
		" sticky AS (DELETE FROM berth_sticky_ports WHERE host_no = $1)" +
		" UPDATE berth_hosts SET retired_at = now(), lost_rows = lost_rows + (SELECT count(*) FROM gone)" +
		" WHERE host_no = $1 RETURNING (SELECT count(*) FROM gone)"
)

// claim registers the host or renews its lease to ttl from now, by the
// server's clock, reports what it lost meanwhile, and
// checks the exclusion constraint (see guard).
func (s *Store) claim(ctx context.Context, op string, ttl time.Duration) error {
	if err := s.open(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var (
		hostNo                 int32
		lost, leftMS           int64
		retired, lapsed, taken bool
		guarded                bool
		boot                   string
	)
	cctx, cancel := s.call(ctx)
	defer cancel()
	scan := func() error {
		return s.pool.QueryRow(cctx, qClaimHost, s.host, ttl.Milliseconds(), s.bootID).
			Scan(&hostNo, &lost, &retired, &lapsed, &taken, &boot, &leftMS, &guarded)
	}
	err := scan()
	registered := false
	if errors.Is(err, pgx.ErrNoRows) {
		// A new host, or one whose row was lost: register it, under its old number if free.
		if _, err = s.register(cctx, s.pool, ttl); err == nil {
			registered = true
			err = scan()
		}
	}
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if taken {
		// Another machine holds the name: touch nothing.
		return fmt.Errorf("%s: %w", op, &refusal{fmt.Sprintf("host %q is in use by another machine (boot id %s), whose lease on the name runs %v more: "+
			"give this machine a host name of its own (--host or BERTH_HOST; Options.Host); "+
			"if it is this machine before a reboot, the name is free once that lease has run out",
			s.host, boot, (time.Duration(leftMS) * time.Millisecond).Round(time.Second)),
			&store.FieldError{Field: "host", Value: s.host, Want: "a host name no other machine uses under a live lease (--host or BERTH_HOST; Options.Host)"}})
	}
	if lapsed && boot != "" && boot != s.bootID && s.bootID != "" {
		// A reboot: the old boot's rows are judged dead and reaped.
		s.log.Info("this host's lapsed lease was held by another boot; this boot takes it over", "host", s.host, "previous", boot, "boot", s.bootID)
	}
	old := s.num.Swap(hostNo)
	// Rows other hosts deleted are an error: owners on this host may still
	// use those ports. A lease that lapsed without loss is normal for a
	// host whose only berth processes are short commands.
	switch {
	case lost > 0:
		s.lost.Add(lost)
		err := fmt.Errorf("%d reservations of host %q were deleted by another host; their owners may still use those ports, which can be handed out again", lost, s.host)
		s.log.Error(err, "this host's lease lapsed or the host was retired", "host", s.host, "rows", lost, "retired", retired)
	case retired:
		s.log.Info("this host had been retired; it holds a fresh lease now", "host", s.host)
	case lapsed:
		s.log.V(1).Info("this host's lease had lapsed; renewed, no reservations were lost", "host", s.host)
	}
	switch {
	case old == 0: // Open
	case hostNo != old:
		s.noteLoss(fmt.Sprintf("host %q was registered anew as number %d (it was %d): its registration was lost", s.host, hostNo, old))
	case registered:
		s.noteLoss(fmt.Sprintf("host %q was registered anew: its registration was lost", s.host))
	case lost > 0 || retired:
		s.noteLoss(fmt.Sprintf("%d reservations of host %q were deleted by another host (retired: %v)", lost, s.host, retired))
	default:
		// Every renewal: a commit lost in a failover leaves no other trace.
		s.noteLoss("lease renewal")
	}
	if err := s.guard(ctx, guarded); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	// The session is renewed with the lease: see grace.go.
	if _, err := s.sync(cctx, s.pool, old == 0); err != nil {
		return s.fail(ctx, op, err)
	}
	s.reassert(cctx, s.pool)
	return nil
}

// Retire deletes every reservation and remembered port of another host
// of the fleet, one gone for good (berth host retire), and returns how
// many reservations it deleted. It runs in one transaction that locks the
// host's row, so none of that host's inserts slips past it.
//
// A host whose lease is live, whose processes may hold ports still in
// use, is refused with an error wrapping store.ErrInvalid, unless
// RetireOptions.Force.
//
// The host is marked retired and its lost reservations counted, for it
// to learn should it come back (see the package doc). Retiring this
// Store's own host is refused (store.ErrInvalid); an unknown host is an
// error wrapping store.ErrNotFound.
func (s *Store) Retire(ctx context.Context, host string, opts RetireOptions) (int, error) {
	op := "retire host " + strconv.Quote(host)
	if host == "" {
		return 0, &store.FieldError{Field: "host", Value: host, Want: "the name of a host of the fleet"}
	}
	if err := checkHost(host); err != nil {
		return 0, err
	}
	if host == s.host {
		return 0, &store.FieldError{Field: "host", Value: host,
			Want: "another host than this store's own (" + strconv.Quote(s.host) + "); retire a host from another one"}
	}
	if err := s.open(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	var (
		n    int64
		live *refusal
	)
	cctx, cancel := s.call(ctx)
	defer cancel()
	err := pgx.BeginFunc(cctx, s.pool, func(tx pgx.Tx) error {
		var (
			hostNo  int32
			isLive  bool
			expires time.Time
			leftMS  int64
		)
		if err := tx.QueryRow(cctx, qLockHost, host).Scan(&hostNo, &isLive, &expires, &leftMS); err != nil {
			return err
		}
		if isLive && !opts.Force {
			live = &refusal{fmt.Sprintf("host %q holds a live lease until %s by the PostgreSQL server's clock (%v more): "+
				"berth ran on that host within its lease period, and retiring it would hand out the ports its processes may still use; "+
				"retire it once it is gone and its lease has ended, or force it (berth host retire --force; RetireOptions.Force), "+
				"and its live holders put their reservations back at their next lease renewal",
				host, expires.UTC().Format(time.RFC3339), (time.Duration(leftMS) * time.Millisecond).Round(time.Second)),
				&store.FieldError{Field: "host", Value: host, Want: "a host whose lease has ended, or RetireOptions.Force (berth host retire --force)"}}
			return nil // nothing was changed: the commit ends the lock
		}
		return tx.QueryRow(cctx, qRetireHost, hostNo).Scan(&n)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, &refusal{fmt.Sprintf("no host %q has used this store: check the name (berth doctor --host NAME on that host shows it)", host), store.ErrNotFound}
	case err != nil:
		return 0, s.fail(ctx, op, err)
	case live != nil:
		return 0, fmt.Errorf("%s: %w", op, live)
	}
	s.log.Info("retired a host; its reservations are deleted", "host", host, "rows", n, "forced", opts.Force)
	return int(n), nil
}

// refusal says what was refused and why, and wraps a *store.FieldError or an error of package store.
type refusal struct {
	msg string
	err error
}

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return e.err }

// reapLapsed deletes, in one transaction, the rows of other hosts whose lease ended more than
// ReapAfter ago, and returns how many.
func (s *Store) reapLapsed(ctx context.Context) (int64, error) {
	if s.reap < 0 {
		return 0, nil
	}
	type reaped struct {
		host string
		n    int64
	}
	var got []reaped
	cctx, cancel := s.call(ctx)
	defer cancel()
	err := pgx.BeginFunc(cctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(cctx, qLapsedHosts, s.hostNo(), s.reap.Milliseconds())
		if err != nil {
			return err
		}
		hosts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil || len(hosts) == 0 {
			return err
		}
		rows, err = tx.Query(cctx, qReapHosts, hosts)
		if err != nil {
			return err
		}
		got, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (reaped, error) {
			var x reaped
			err := r.Scan(&x.host, &x.n)
			return x, err
		})
		return err
	})
	if err != nil {
		return 0, s.fail(ctx, "reap hosts whose lease lapsed", err)
	}
	var total int64
	for _, x := range got {
		total += x.n
		s.log.Info("deleted the reservations of a host whose lease lapsed longer ago than ReapAfter",
			"host", x.host, "rows", x.n, "reapAfter", s.reap.String())
	}
	s.reaped.Add(total)
	return total, nil
}
