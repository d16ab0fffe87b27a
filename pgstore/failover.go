package pgstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berth-go/berth/store"
)

// losses is what Check reports (see Failover in the package doc): reasons
// for the holders to compare, and how many of them they have dealt with.
type losses struct {
	lossSeq atomic.Uint64          // bumped by noteLoss
	lossWhy atomic.Pointer[string] // the latest reason
	settled atomic.Uint64          // the lossSeq Check last reported
}

const (
	retryRenew = time.Second     // how soon a failed lease renewal is tried again, at most
	routine    = "lease renewal" // the reason noteLoss is given at every lease renewal
)

func (s *Store) noteLoss(why string) {
	// A renewal does not hide a sign of loss not dealt with yet.
	if p := s.lossWhy.Load(); why != routine || p == nil || *p == routine || s.lossSeq.Load() <= s.settled.Load() {
		s.lossWhy.Store(&why)
	}
	s.lossSeq.Add(1)
	if why != routine {
		s.log.Info("this host's reservations may be missing from the store; its holders put back what they hold", "host", s.host, "cause", why)
	}
}

// Check reports, with an error wrapping store.ErrLost, that this
// process's reservations may be missing from the store, or released ones
// back in it, since Check last said so: a connection came back to another
// server or to a restarted one, the host's registration was lost and made
// again, another host deleted this host's rows, or the host's lease was
// renewed (a lost commit leaves no other trace). It makes no round trip.
// After Close it returns an error wrapping store.ErrClosed.
func (s *Store) Check(_ context.Context) error {
	if err := s.open(); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	seq := s.lossSeq.Load()
	for {
		cur := s.settled.Load()
		if seq <= cur {
			return nil
		}
		if s.settled.CompareAndSwap(cur, seq) {
			break
		}
	}
	why := "unknown"
	if p := s.lossWhy.Load(); p != nil {
		why = *p
	}
	return fmt.Errorf("the reservations of host %q may be missing from the store, or released ones back in it (%s): %w", s.host, why, store.ErrLost)
}

const (
	// qServer reads, on each new connection, when its server started and host $1's number.
	qServer = "SELECT pg_postmaster_start_time(), (SELECT host_no FROM berth_hosts WHERE host_id = $1)"
	// qReRegisterHost registers host $2 again under its old number $1,
	// with a lease of $3 ms for the boot $4, unless either is taken.
	qReRegisterHost = "INSERT INTO berth_hosts (host_no, host_id, expires_at, boot_id) OVERRIDING SYSTEM VALUE" +
		" VALUES ($1, $2, now() + $3::bigint * interval '1 millisecond', $4) ON CONFLICT DO NOTHING"
	// qSkipHostNo keeps the host numbers handed out from now on past $1,
	// which qReRegisterHost took without the sequence.
	qSkipHostNo = "SELECT setval(q.seq, $1::bigint) FROM (SELECT pg_get_serial_sequence('berth_hosts', 'host_no')::regclass AS seq) q" +
		" WHERE coalesce(pg_sequence_last_value(q.seq), 0) < $1"
	qHostNo = "SELECT host_no FROM berth_hosts WHERE host_id = $1"
)

// querier is a connection or the pool.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// register registers the host, whose row is missing, with a lease of ttl,
// under its old number when it is free, and returns its number now.
func (s *Store) register(ctx context.Context, q querier, ttl time.Duration) (int32, error) {
	done := false
	if num := s.hostNo(); num != 0 {
		tag, err := q.Exec(ctx, qReRegisterHost, num, s.host, ttl.Milliseconds(), s.bootID)
		if err != nil {
			return 0, err
		}
		if done = tag.RowsAffected() == 1; done {
			if _, err := q.Exec(ctx, qSkipHostNo, int64(num)); err != nil {
				// A new host may then fail once to register (the
				// number is taken) and succeed the next time.
				s.log.Error(err, "could not move the host numbers' sequence past a number registered again", "host", s.host, "number", num)
			}
		}
	}
	if !done {
		if _, err := q.Exec(ctx, qRegisterHost, s.host, ttl.Milliseconds()); err != nil {
			return 0, err
		}
	}
	var no int32
	if err := q.QueryRow(ctx, qHostNo, s.host).Scan(&no); err != nil {
		return 0, err
	}
	return no, nil
}

// afterConnect runs on every new connection of the pool: it notes a
// server other than the one of the last connection, makes sure the host
// is registered under the number the Store's statements use, and, on
// another server, records it (see grace.go) and re-asserts.
func (s *Store) afterConnect(ctx context.Context, c *pgx.Conn) error {
	var (
		started time.Time
		no      *int32
	)
	if err := c.QueryRow(ctx, qServer, s.host).Scan(&started, &no); err != nil {
		return fmt.Errorf("identify the server: %w", err)
	}
	changed := s.noticeServer(started)
	num := s.hostNo()
	if num == 0 {
		return nil // Open, whose claim registers the host and the session
	}
	switch {
	case no != nil && *no == num:
	case no != nil:
		// Another process of this host registered it again first, under
		// another number: the old one was taken.
		s.num.Store(*no)
		s.noteLoss(fmt.Sprintf("host %q was registered anew as number %d (it was %d): its registration was lost", s.host, *no, num))
	default:
		got, err := s.register(ctx, c, s.sessTTL)
		if err != nil {
			return fmt.Errorf("register host %q again: %w", s.host, err)
		}
		s.num.Store(got)
		s.noteLoss(fmt.Sprintf("host %q was missing from the store (its registration was lost) and is registered again as number %d", s.host, got))
	}
	if changed || s.owes() {
		if _, err := s.sync(ctx, c, false); err != nil {
			return fmt.Errorf("record the server: %w", err)
		}
		s.reassert(ctx, c)
	}
	return nil
}

// RetireOptions tune Retire.
type RetireOptions struct {
	// Force retires a host whose lease is live: ports its running berth
	// processes hold can then be granted again until those holders put
	// their reservations back, at their next lease renewal.
	Force bool
}
