package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/store"
)

// The grace period after a change of server (see the package doc). As an
// NFSv4 server does after a restart (RFC 8881, 8.4.2), the database
// refuses new grants for a while after it finds itself served by another
// server, and takes back what holders held:
//
//   - berth_server records the server by its pg_postmaster_start_time(),
//     which every restart, promotion and restore changes.
//   - Every grant statement reads the record in its own statement (qGate):
//     on an unrecorded server, or within a grace period, it inserts
//     nothing, so no client's timing decides.
//   - The first berth transaction that finds the server unrecorded (qSync)
//     records it and starts the grace period.
//   - Every open Store has a session (berth_sessions), renewed with its
//     host's lease. It re-asserts for a server (qVerify) once every
//     reservation granted through it and still held is in the table again
//     and no row released through it in the last ten minutes is.
//   - The period ends early once every live session has re-asserted, but
//     never less than a second after it began: time for a Store the new
//     server has no session of to connect again (see watch).
//
// Not covered: rows of Stores the new server never heard of, rows granted
// through no live Store (a port transferred to a child), and a holder that
// does not put its rows back in time. On a host, portlock's kernel locks
// keep such ports from other berth processes; only a fleet-wide grant can
// meet them.

const (
	minGraceMargin     = 2 * time.Second // added to a third of the lease: see Options.Grace
	defaultGraceMargin = 5 * time.Second
	maxGrace           = 10 * time.Minute       // bounds Options.Grace: a longer pause is a misconfiguration
	pollGrace          = 100 * time.Millisecond // how often a grant waiting out a grace period looks again
	watchRetry         = 250 * time.Millisecond // how often watch connects again
)

// gateCase is the gate's wait in ms, for the berth_server row s: 0 when
// grants may go on; -1 when the server is not the recorded one; else the
// ms left of the grace period, while some live session has not
// re-asserted for the server (or for a second at least).
const gateCase = "CASE WHEN s.id IS NULL OR s.started <> pg_postmaster_start_time() THEN -1" +
	" WHEN s.grace_until > now() AND (now() < s.changed_at + interval '1 second' OR EXISTS (SELECT 1 FROM berth_sessions x" +
	"  WHERE x.expires_at > now() AND x.acked IS DISTINCT FROM s.started))" +
	" THEN greatest(1, ceil(extract(epoch FROM s.grace_until - now()) * 1000))::bigint" +
	" ELSE 0 END"

const (
	// qGate is the CTE of every grant statement: it inserts only when wait_ms (gateCase) is 0.
	qGate     = "gate AS (SELECT " + gateCase + " AS wait_ms FROM (SELECT 1) one LEFT JOIN berth_server s ON s.id = 1)"
	qGateWait = "WITH " + qGate + " SELECT wait_ms FROM gate"

	// qSync records another server than the recorded one, starting a
	// grace period of the longest grace of the live sessions and this
	// Store's ($4 ms), and renews this Store's session $1 (of host $2, $3
	// ms, its process $5 $6 $7 of boot $8), registering it when it is
	// missing: acked for $9 (or for this server when $10, a new Store). It
	// returns the server's start time, the recorded one before, whether it
	// recorded a change, the gate's wait, the session's acked and whether
	// it was registered now.
	qSync = "WITH cur AS (SELECT pg_postmaster_start_time() AS started)," +
		" grace AS (SELECT greatest($4::bigint, (SELECT coalesce(max(grace_ms), 0) FROM berth_sessions WHERE expires_at > now())) AS ms)," +
		" rec AS (UPDATE berth_server b SET previous = b.started, started = cur.started, system_id = berth_server_system(), timeline = berth_server_timeline()," +
		"  changed_at = now(), grace_until = now() + (SELECT ms FROM grace) * interval '1 millisecond'" +
		"  FROM cur WHERE b.id = 1 AND b.started <> cur.started RETURNING b.id)," +
		" first AS (INSERT INTO berth_server (id, started, system_id, timeline, grace_until)" +
		"  SELECT 1, cur.started, berth_server_system(), berth_server_timeline(), now() + (SELECT ms FROM grace) * interval '1 millisecond'" +
		"  FROM cur WHERE NOT EXISTS (SELECT 1 FROM berth_server) ON CONFLICT (id) DO NOTHING RETURNING id)," +
		" sess AS (INSERT INTO berth_sessions AS x (session_id, host_id, owner_pid, owner_start, owner_scope, boot_id, expires_at, grace_ms, acked)" +
		"  SELECT $1, $2, $5, $6, $7, $8, now() + $3::bigint * interval '1 millisecond', $4, CASE WHEN $10::bool THEN cur.started ELSE $9::timestamptz END FROM cur" +
		"  ON CONFLICT (session_id) DO UPDATE SET expires_at = greatest(x.expires_at, excluded.expires_at), grace_ms = excluded.grace_ms" +
		"  RETURNING x.acked, x.xmax = 0 AS inserted)" +
		" SELECT cur.started, s.started, (SELECT count(*) FROM rec) + (SELECT count(*) FROM first) > 0," +
		" CASE WHEN (SELECT count(*) FROM rec) + (SELECT count(*) FROM first) > 0 THEN (SELECT ms FROM grace) ELSE " + gateCase + " END," +
		" sess.acked, sess.inserted" +
		" FROM cur CROSS JOIN sess LEFT JOIN berth_server s ON s.id = 1"

	// qVerify checks that the process rows $2..$7 (on host $1) and the
	// live lease rows $8..$12 are in the table, and the released process
	// rows $14..$19 are not; when so, it marks session $13 re-asserted. It
	// returns the indexes (from 1) of those that fail, the session's new
	// acked (NULL: not marked), the server's start time and the gate's wait.
	qVerify = "WITH " + qGate + "," +
		" p AS (SELECT * FROM unnest($2::text[], $3::int[], $4::text[], $5::int[], $6::bigint[], $7::text[]) WITH ORDINALITY AS w(proto, port, addr, pid, start, scope, i))," +
		" f AS (SELECT * FROM unnest($8::text[], $9::int[], $10::text[], $11::text[], $12::timestamptz[]) WITH ORDINALITY AS w(proto, port, addr, holder, expires, i))," +
		" mp AS (SELECT p.i FROM p WHERE NOT EXISTS (SELECT 1 FROM berth_port_allocations a WHERE a.host_no = $1 AND a.protocol = p.proto" +
		"  AND a.port = p.port AND a.address = p.addr::inet AND a.owner_pid = p.pid AND a.owner_start = p.start AND a.owner_scope = p.scope))," +
		" mf AS (SELECT f.i FROM f WHERE f.expires > now() AND NOT EXISTS (SELECT 1 FROM berth_port_allocations a WHERE a.owner_kind = 'lease'" +
		"  AND a.protocol = f.proto AND a.port = f.port AND a.address = f.addr::inet AND a.holder = f.holder))," +
		" r AS (SELECT * FROM unnest($14::text[], $15::int[], $16::text[], $17::int[], $18::bigint[], $19::text[]) WITH ORDINALITY AS w(proto, port, addr, pid, start, scope, i))," +
		" br AS (SELECT r.i FROM r WHERE EXISTS (SELECT 1 FROM berth_port_allocations a WHERE a.host_no = $1 AND a.protocol = r.proto" +
		"  AND a.port = r.port AND a.address = r.addr::inet AND a.owner_pid = r.pid AND a.owner_start = r.start AND a.owner_scope = r.scope))," +
		" ack AS (UPDATE berth_sessions SET acked = pg_postmaster_start_time() WHERE session_id = $13" +
		"  AND NOT EXISTS (SELECT 1 FROM mp) AND NOT EXISTS (SELECT 1 FROM mf) AND NOT EXISTS (SELECT 1 FROM br) RETURNING acked)" +
		" SELECT coalesce((SELECT array_agg(i::int) FROM mp), '{}'), coalesce((SELECT array_agg(i::int) FROM mf), '{}')," +
		" coalesce((SELECT array_agg(i::int) FROM br), '{}'), (SELECT acked FROM ack), pg_postmaster_start_time(), (SELECT wait_ms FROM gate)"

	qHostSessions = "SELECT session_id, owner_pid, owner_start, owner_scope, boot_id FROM berth_sessions" +
		" WHERE host_id = $1 AND session_id <> $2 AND expires_at > now() AND acked IS DISTINCT FROM pg_postmaster_start_time()"
	qDropSessions = "DELETE FROM berth_sessions WHERE host_id = $1 AND session_id = ANY($2::text[])"
	qReleaseAgain = "DELETE FROM berth_port_allocations p USING unnest($1::text[], $2::int[], $3::text[], $4::text[]) AS d(proto, port, addr, holder)" +
		" WHERE p.owner_kind = 'lease' AND p.protocol = d.proto AND p.port = d.port AND p.address = d.addr::inet AND p.holder = d.holder"
	qEndSession   = "DELETE FROM berth_sessions WHERE session_id = $1"
	qReapSessions = "DELETE FROM berth_sessions WHERE expires_at < now()"

	qGraceState = "WITH " + qGate + " SELECT s.started, s.previous, s.changed_at, s.grace_until, gate.wait_ms," +
		" (SELECT count(*) FROM berth_sessions x WHERE x.expires_at > now() AND x.acked IS DISTINCT FROM s.started), now()" +
		" FROM berth_server s CROSS JOIN gate WHERE s.id = 1"
)

// checkGrace validates Options.Grace for a lease of ttl; zero: its default.
func checkGrace(grace, ttl time.Duration) (time.Duration, error) {
	notice := openTTL(ttl) / 3 // the longest a live Store takes to notice a change
	switch least := notice + minGraceMargin; {
	case grace == 0:
		return notice + defaultGraceMargin, nil
	case grace < least || grace > maxGrace:
		return 0, &store.FieldError{Field: "grace", Value: grace.String(),
			Want: fmt.Sprintf("a grace period of %v (a third of the lease, in which every live Store notices a change of server, and 2s for its holders to put their reservations back) to %v; zero: %v",
				least, maxGrace, notice+defaultGraceMargin)}
	}
	return grace, nil
}

// openTTL is the lease of a Store's host and session: ttl, or 30s when not positive.
func openTTL(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return 30 * time.Second
	}
	return ttl
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// graceState is the server a Store saw last, and the one its session
// re-asserted for.
type graceState struct {
	seen       atomic.Pointer[time.Time]
	acked      atomic.Pointer[time.Time]
	reassertMu sync.Mutex // one verification at a time
}

// noticeServer notes the server a connection found and reports whether it is another than the last.
func (s *Store) noticeServer(started time.Time) bool {
	prev := s.seen.Swap(&started)
	if prev == nil || prev.Equal(started) {
		return false
	}
	s.noteLoss(fmt.Sprintf("connected to a server that started at %s, not the one of the last connection (started at %s): "+
		"a failover or a restart may have lost the last commits", started.UTC().Format(time.RFC3339Nano), prev.UTC().Format(time.RFC3339Nano)))
	return true
}

// owes reports whether this Store has yet to re-assert for the server.
func (s *Store) owes() bool {
	seen := s.seen.Load()
	if seen == nil {
		return false
	}
	a := s.acked.Load()
	return a == nil || !a.Equal(*seen)
}

// sync runs qSync on q (fresh: a new Store, with nothing to re-assert) and returns the gate's wait.
func (s *Store) sync(ctx context.Context, q querier, fresh bool) (int64, error) {
	var (
		started            time.Time
		prev, acked        *time.Time
		wait               int64
		recorded, inserted bool
	)
	err := q.QueryRow(ctx, qSync, s.session, s.host, s.sessTTL.Milliseconds(), s.grace.Milliseconds(),
		s.self.PID, s.self.Start, s.self.Namespace, s.bootID, s.acked.Load(), fresh).
		Scan(&started, &prev, &recorded, &wait, &acked, &inserted)
	if err != nil {
		return 0, err
	}
	owed := s.owes()
	changed := s.noticeServer(started)
	s.acked.Store(acked)
	if !owed && !changed && s.owes() && !fresh {
		// A change this Store's own connections did not show (another
		// Store recorded it first, or a restore brought back the same
		// server): its holders compare all the same.
		s.noteLoss("the store recorded a change of server, which may have lost the last commits")
	}
	if recorded {
		was := "none"
		if prev != nil {
			was = prev.UTC().Format(time.RFC3339Nano)
		}
		s.log.Info("the database is served by another PostgreSQL server than the one recorded (a failover, a restart or a restore, which may have lost the last commits): "+
			"grants are paused until every berth process of the fleet has put back what it holds, or for the grace period at most",
			"started", started.UTC().Format(time.RFC3339Nano), "recorded", was, "grace", (time.Duration(wait) * time.Millisecond).String(), "host", s.host)
	}
	if inserted && !fresh {
		s.log.Info("this process's session was missing from the store (a change of server lost it) and is registered again", "host", s.host)
	}
	return wait, nil
}

// reassert marks the Store's session re-asserted for the server, on q, once every reservation
// granted through it and still held is in the table and none released through it lately is
// (qVerify), and reports whether the Store owes nothing now. Once the grace period is over, what
// is still missing was not put back in time: it is logged and forgotten. Errors report false.
func (s *Store) reassert(ctx context.Context, q querier) bool {
	if !s.owes() {
		return true
	}
	s.reassertMu.Lock()
	defer s.reassertMu.Unlock()
	if !s.owes() {
		return true
	}
	s.clearDeadSessions(ctx, q)
	s.releaseAgain(ctx, q)
	for try := 0; ; try++ {
		procs, leases := s.book.snapshot(ctx)
		released := s.book.releasedRowsLately()
		var (
			fProto, fAddr, fHolder []string
			fPort                  []int32
			fExpires               []time.Time
		)
		for _, l := range leases {
			fProto, fPort, fAddr = append(fProto, string(l.Protocol)), append(fPort, int32(l.Port)), append(fAddr, l.Addr.String())
			fHolder, fExpires = append(fHolder, l.Holder), append(fExpires, l.Expires)
		}
		var (
			missP, missF, backR []int32
			acked               *time.Time
			started             time.Time
			wait                int64
		)
		args := append([]any{s.hostNo()}, procColumns(procs)...)
		args = append(append(args, fProto, fPort, fAddr, fHolder, fExpires, s.session), procColumns(released)...)
		err := q.QueryRow(ctx, qVerify, args...).
			Scan(&missP, &missF, &backR, &acked, &started, &wait)
		if err != nil {
			s.log.V(1).Info("could not check this process's reservations against the new server; tried again", "host", s.host, "error", s.scrub.String(err.Error()))
			return false
		}
		s.noticeServer(started)
		switch {
		case acked != nil:
			s.acked.Store(acked)
			s.log.V(1).Info("every reservation granted through this process is in the store again: re-asserted for the new server", "host", s.host,
				"reservations", len(procs), "leases", len(leases))
			return true
		case len(missP)+len(missF)+len(backR) == 0 && try == 0:
			// Nothing missing, and no session to mark: the change lost it.
			if _, err := s.sync(ctx, q, false); err != nil {
				s.log.V(1).Info("could not register this process's session again; tried again", "host", s.host, "error", s.scrub.String(err.Error()))
				return false
			}
			continue
		case wait == 0:
			// The grace period is over: what is missing now was not put
			// back in time, and is someone else's or nobody's.
			for _, i := range missP {
				r := procs[i-1]
				s.book.drop(r.Key, r.Owner)
				s.log.Error(errors.New("not put back before the grace period after a change of server ended"),
					"a reservation granted through this process is missing from the store; its port may be granted again (on its host, its lock keeps it from other berth processes)",
					"reservation", r.String())
			}
			for _, i := range missF {
				l := leases[i-1]
				s.book.unlease(l.Key, l.Holder)
				s.log.Error(errors.New("not renewed before the grace period after a change of server ended"),
					"a fleet-wide reservation granted through this process is missing from the store; its port may be granted again", "holder", l.Holder, "key", l.String())
			}
			for _, i := range backR {
				r := released[i-1]
				s.book.forgetRelease(r)
				s.log.Error(errors.New("not released again before the grace period after a change of server ended"),
					"a reservation released through this process is back in the store; its port stays taken until it is released or its owner exits",
					"reservation", r.String())
			}
			s.acked.Store(&started)
			return true
		}
		return false
	}
}

// procColumns returns rs as arrays of columns, in qVerify's order.
func procColumns(rs []store.Reservation) []any {
	var (
		proto, addr, scope []string
		port, pid          []int32
		start              []int64
	)
	for _, r := range rs {
		proto, port, addr = append(proto, string(r.Protocol)), append(port, int32(r.Port)), append(addr, r.Addr.String())
		pid, start, scope = append(pid, int32(r.Owner.PID)), append(start, r.Owner.Start), append(scope, r.Owner.Namespace)
	}
	return []any{proto, port, addr, pid, start, scope}
}

// releaseAgain deletes again, on q, the lease rows released through this
// Store lately, which a change of server may have brought back in the way
// of rows their holders put back. (A process row is its holder's to
// release again, as portalloc does.) Errors are logged.
func (s *Store) releaseAgain(ctx context.Context, q querier) {
	ks := s.book.releasedLately()
	if len(ks) == 0 {
		return
	}
	var proto, addr, holder []string
	var port []int32
	for _, k := range ks {
		proto, port, addr, holder = append(proto, string(k.key.Protocol)), append(port, int32(k.key.Port)), append(addr, k.key.Addr.String()), append(holder, k.holder)
	}
	tag, err := q.Exec(ctx, qReleaseAgain, proto, port, addr, holder)
	if err != nil {
		s.log.V(1).Info("could not release again the leases released lately", "host", s.host, "error", s.scrub.String(err.Error()))
		return
	}
	if n := tag.RowsAffected(); n > 0 {
		s.log.Info("released again leases released before a change of server, which the change had brought back", "host", s.host, "leases", n)
	}
}

// reassertNow re-asserts if the Store owes it: after a holder put a row back.
func (s *Store) reassertNow(ctx context.Context) {
	if !s.owes() {
		return
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	s.reassert(cctx, s.pool)
}

// clearDeadSessions deletes this host's sessions not re-asserted whose processes have exited
// (or are of another boot), lest they hold up the grace period until their lease runs out.
func (s *Store) clearDeadSessions(ctx context.Context, q querier) {
	type sess struct {
		id   string
		own  store.Owner
		boot string
	}
	var all []sess
	rows, err := q.Query(ctx, qHostSessions, s.host, s.session)
	if err == nil {
		all, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (sess, error) {
			var x sess
			err := r.Scan(&x.id, &x.own.PID, &x.own.Start, &x.own.Namespace, &x.boot)
			return x, err
		})
	}
	if err != nil {
		s.log.V(1).Info("could not read this host's sessions", "host", s.host, "error", s.scrub.String(err.Error()))
		return
	}
	var dead []string
	for _, x := range all {
		if (x.boot != "" && s.bootID != "" && x.boot != s.bootID) || !x.own.Alive(ctx) {
			dead = append(dead, x.id)
		}
	}
	if len(dead) == 0 {
		return
	}
	if _, err := q.Exec(ctx, qDropSessions, s.host, dead); err != nil {
		s.log.V(1).Info("could not delete the sessions of exited processes", "host", s.host, "error", s.scrub.String(err.Error()))
		return
	}
	s.log.V(1).Info("deleted the sessions of exited processes of this host", "host", s.host, "sessions", len(dead))
}

// graceError reports a grant held up by the grace period after a change
// of server. It wraps store.ErrGrace.
type graceError struct {
	Left    time.Duration // how long the grace period runs at most, as of the refusal
	Own     bool          // refused at once, so that this process's holders can put their reservations back
	Blocked error         // a holder's re-assertion met another row: it is to be tried again
}

func (e *graceError) Error() string {
	left := e.Left.Round(time.Millisecond)
	if e.Blocked != nil {
		return fmt.Sprintf("cannot put the reservation back yet in the grace period after a change of the PostgreSQL server (%v): "+
			"another row holds the port, most likely one released before the change that the change brought back and its holder releases again: try again", e.Blocked)
	}
	if e.Own {
		return fmt.Sprintf("grants are paused after a change of the PostgreSQL server (a failover, a restart or a restore may have lost the last commits) "+
			"while this process puts back the reservations it holds and releases again those the change brought back: ask again in a moment (the pause ends within %v)", left)
	}
	return fmt.Sprintf("grants are paused after a change of the PostgreSQL server (a failover, a restart or a restore may have lost the last commits) "+
		"until every berth process of the fleet has put back the reservations it holds, %v at most: ask again", left)
}

func (e *graceError) Unwrap() error { return store.ErrGrace }

// waitGrace waits, within ctx, for the grace period a grant met (wait) to end. While this Store has
// yet to re-assert, it fails at once, so that its process's holders can put their rows back meanwhile.
func (s *Store) waitGrace(ctx context.Context, op string, wait int64) error {
	synced := false
	for {
		if wait < 0 || !synced {
			// Record another server; learn whether this Store's session has re-asserted
			// for it (another Store may have recorded it), registering it again if lost.
			cctx, cancel := s.call(ctx)
			w, err := s.sync(cctx, s.pool, false)
			if err == nil && w != 0 {
				s.clearDeadSessions(cctx, s.pool)
			}
			cancel()
			if err != nil {
				return s.fail(ctx, op, err)
			}
			wait, synced = w, true
			continue
		}
		if wait == 0 {
			return nil
		}
		ge := &graceError{Left: time.Duration(wait) * time.Millisecond}
		cctx, cancel := s.call(ctx)
		ok := s.reassert(cctx, s.pool)
		cancel()
		if !ok {
			ge.Own = true
			return fmt.Errorf("%s: %w", op, ge)
		}
		t := time.NewTimer(min(pollGrace, ge.Left))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w: %w", op, ge, ctx.Err())
		case <-t.C:
		}
		var err error
		if wait, err = s.gateWait(ctx, op); err != nil {
			return err
		}
	}
}

// gateWait reads the gate's wait (see gateCase).
func (s *Store) gateWait(ctx context.Context, op string) (int64, error) {
	var wait int64
	err := s.queryRow(ctx, op, qGateWait, nil, &wait)
	return wait, err
}

// watch keeps an idle connection to the server until Close: when the server goes away, it connects
// again every watchRetry, records a change of server and re-asserts, without waiting for a call.
func (s *Store) watch() {
	defer s.wg.Done()
	ctx := s.life
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			cctx, ccancel := s.call(ctx)
			c, err := pgx.ConnectConfig(cctx, s.watchCfg)
			if err == nil {
				_, err = s.sync(cctx, c, false)
				if err != nil {
					closeConn(c)
				}
			}
			ccancel()
			if err != nil {
				if ctx.Err() == nil {
					s.log.V(1).Info("the server is out of reach; connecting again", "host", s.host, "in", watchRetry.String(), "error", s.scrub.String(err.Error()))
				}
				t := time.NewTimer(watchRetry)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
				continue
			}
			conn = c
		}
		period := 10 * time.Second
		if s.owes() {
			cctx, ccancel := s.call(ctx)
			if !s.reassert(cctx, conn) {
				period = watchRetry
			}
			ccancel()
		}
		wctx, wcancel := context.WithTimeout(ctx, period)
		_, err := conn.WaitForNotification(wctx)
		wcancel()
		if conn.IsClosed() || (err != nil && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && wctx.Err() == nil) {
			s.log.V(1).Info("the connection to the server ended (a failover or a restart?); connecting again", "host", s.host)
			closeConn(conn)
			conn = nil
		}
	}
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

func (s *Store) endSession() {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, qEndSession, s.session); err != nil {
		s.log.V(1).Info("could not delete this process's session; it ends with its lease", "host", s.host, "error", s.scrub.String(err.Error()))
	}
}

// GraceState says whether grants are paused after a change of server.
type GraceState struct {
	// Server is when the server that serves the database started, as
	// recorded; Previous the one before it (zero: none recorded).
	Server, Previous time.Time
	// Changed is when the change was recorded, and Until when the grace
	// period it started ends at the latest (zero: none).
	Changed, Until time.Time
	// Paused says that grants are held up now: Left more at most.
	Paused bool
	Left   time.Duration
	// Waiting counts the open Stores of the fleet not re-asserted yet.
	Waiting int
	// Now is the server's time as of the reading.
	Now time.Time
}

// Grace reports whether grants are paused after a change of server, and
// until when. It records nothing.
func (s *Store) Grace(ctx context.Context) (GraceState, error) {
	var (
		g               GraceState
		prev, until     *time.Time
		wait, waitingNo int64
	)
	if err := s.queryRow(ctx, "read the grace period", qGraceState, nil, &g.Server, &prev, &g.Changed, &until, &wait, &waitingNo, &g.Now); err != nil {
		return GraceState{}, err
	}
	if prev != nil {
		g.Previous = *prev
	}
	if until != nil {
		g.Until = *until
	}
	g.Paused, g.Waiting = wait != 0, int(waitingNo)
	if wait > 0 {
		g.Left = time.Duration(wait) * time.Millisecond
	}
	return g, nil
}

// ledger is what was granted through a Store and not given up, which it checks is in the table
// again before it re-asserts; and what was released through it lately, which a change of server
// may have brought back: rows, which it checks are gone again, and leases, which it releases again.
type ledger struct {
	mu       sync.Mutex
	procs    map[procKey]store.Reservation
	leases   map[leaseKey]FleetReservation
	released map[leaseKey]time.Time
	relProcs map[procKey]store.Reservation // Created: when released
}

const redoWindow = 10 * time.Minute

func newLedger() ledger {
	return ledger{procs: map[procKey]store.Reservation{}, leases: map[leaseKey]FleetReservation{},
		released: map[leaseKey]time.Time{}, relProcs: map[procKey]store.Reservation{}}
}

type procKey struct {
	key   store.Key
	pid   int
	start int64
	scope string
}

type leaseKey struct {
	key    store.Key
	holder string
}

func procKeyOf(k store.Key, o store.Owner) procKey { return procKey{k, o.PID, o.Start, o.Namespace} }

func (l *ledger) hold(r store.Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := procKeyOf(r.Key, r.Owner)
	l.procs[k] = r
	delete(l.relProcs, k)
}

func (l *ledger) release(r store.Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := procKeyOf(r.Key, r.Owner)
	delete(l.procs, k)
	l.relProcs[k] = store.Reservation{Key: r.Key, Owner: r.Owner, Created: time.Now()}
}

func (l *ledger) forgetRelease(r store.Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.relProcs, procKeyOf(r.Key, r.Owner))
}

// releasedRowsLately returns the process rows released within redoWindow, forgetting older ones.
func (l *ledger) releasedRowsLately() []store.Reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []store.Reservation
	for k, r := range l.relProcs {
		if time.Since(r.Created) > redoWindow {
			delete(l.relProcs, k)
			continue
		}
		out = append(out, store.Reservation{Key: r.Key, Owner: r.Owner})
	}
	return out
}

func (l *ledger) drop(k store.Key, own store.Owner) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.procs, procKeyOf(k, own))
}

func (l *ledger) lease(r FleetReservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leases[leaseKey{r.Key, r.Holder}] = r
	delete(l.released, leaseKey{r.Key, r.Holder})
}

func (l *ledger) releaseLease(k store.Key, holder string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.leases, leaseKey{k, holder})
	l.released[leaseKey{k, holder}] = time.Now()
}

func (l *ledger) releasedLately() []leaseKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []leaseKey
	for k, at := range l.released {
		if time.Since(at) > redoWindow {
			delete(l.released, k)
			continue
		}
		out = append(out, k)
	}
	return out
}

func (l *ledger) unlease(k store.Key, holder string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.leases, leaseKey{k, holder})
}

func (l *ledger) narrow(k store.Key, holder, host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.leases[leaseKey{k, holder}]; ok {
		r.Host = host
		l.leases[leaseKey{k, holder}] = r
	}
}

func (l *ledger) leaseOf(k store.Key, holder string) (FleetReservation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.leases[leaseKey{k, holder}]
	return r, ok
}

// snapshot returns what the ledger holds, less (and forgetting) the
// process rows of exited owners.
func (l *ledger) snapshot(ctx context.Context) ([]store.Reservation, []FleetReservation) {
	l.mu.Lock()
	procs, leases := slices.Collect(maps.Values(l.procs)), slices.Collect(maps.Values(l.leases))
	l.mu.Unlock()
	alive := map[ownerKey]bool{}
	live := procs[:0]
	for _, r := range procs {
		k := ownerKey{r.Owner.PID, r.Owner.Start, r.Owner.Namespace}
		v, ok := alive[k]
		if !ok {
			v = r.Owner.Alive(ctx)
			alive[k] = v
		}
		if v {
			live = append(live, r)
		} else {
			l.drop(r.Key, r.Owner)
		}
	}
	return live, leases
}
