package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/store"
)

// The grace period after a change of server.
//
// A failover to an asynchronous standby, a crash of a server that runs
// with synchronous_commit off, or a restore from backup loses the last
// commits: rows of live holders among them. Until their holders put them
// back, the ports could be granted again. So, as an NFSv4 server does after
// a restart (RFC 8881, 8.4.2), the database refuses new grants for a while
// after it finds itself served by another server, and takes back what
// holders held:
//
//   - berth_server records the server that serves the database, by its
//     pg_postmaster_start_time(), which every restart, promotion and
//     restore changes (its timeline and system identifier are recorded
//     too, for people). The migration that made the table recorded the
//     first one: a fresh database starts no grace period.
//   - Every grant statement (Reserve, Scan, ScanBlock, ReserveFleet,
//     ReserveFleetSet) reads the record in its own statement (qGate): on
//     another server than the recorded one, or within a grace period, it
//     inserts nothing. So no client's timing decides: a grant on the new
//     server is held up whichever client gets there first.
//   - The first berth transaction on the new server that finds it
//     unrecorded (qSync: on every new connection to another server, and
//     at every lease renewal) records it and starts the grace period: the
//     longest Options.Grace of the fleet's live Stores, from then by the
//     server's clock.
//   - Every open Store has a session (berth_sessions), renewed with its
//     host's lease. A Store re-asserts for a server once every reservation
//     granted through it and still held (a process row whose owner lives,
//     a fleet-wide lease that has not run out) is in the table again, and
//     no row released through it in the last ten minutes is: its holders
//     put theirs back (Reserve with Request.Restore, which the grace
//     period lets through; RenewFleet, which puts back a lease row it finds
//     missing in a grace period) and release again what the change
//     brought back (the Store does so itself for leases), and the Store
//     checks that with one query (qVerify) and marks its session (acked).
//     A Store that granted and released nothing re-asserts at once.
//   - The grace period ends early once every live session has re-asserted
//     for the new server, but never less than a second after it began
//     (the floor: time for a Store the new server has no session of to
//     connect again, see watch).
//
// What this does not cover: rows of Stores the new server never heard of
// (a Store opened within the replication lag before the failover loses
// its session with its rows; the floor gives it a second to connect
// again), rows granted through no live Store (a port transferred to a
// child, the shell of berth get: their holders run no berth code), and a
// holder that does not put its rows back within the grace period. On a
// host, portlock's kernel locks keep such ports from every other berth
// process of the host all the same; only a fleet-wide grant can meet them.

const (
	// minGraceMargin and defaultGraceMargin are added to a third of the
	// lease, the longest a live Store takes to notice a change (at its
	// renewal): the time its holders have to put their rows back.
	minGraceMargin     = 2 * time.Second
	defaultGraceMargin = 5 * time.Second
	// maxGrace bounds Options.Grace: grants paused longer than that are a
	// misconfiguration, not safety.
	maxGrace = 10 * time.Minute
	// pollGrace is how often a grant waiting out a grace period looks
	// again; watchRetry how often the watch connects again to a server
	// that went away.
	pollGrace  = 100 * time.Millisecond
	watchRetry = 250 * time.Millisecond
)

// gateCase is the gate's wait in ms, for the berth_server row s: 0 when
// grants may go on; -1 when the server is not the recorded one (no berth
// transaction has recorded the change yet); else the ms left of the grace
// period, while it runs and some live session has not re-asserted for the
// server (or for a second at least: the floor).
const gateCase = "CASE WHEN s.id IS NULL OR s.started <> pg_postmaster_start_time() THEN -1" +
	" WHEN s.grace_until > now() AND (now() < s.changed_at + interval '1 second' OR EXISTS (SELECT 1 FROM berth_sessions x" +
	"  WHERE x.expires_at > now() AND x.acked IS DISTINCT FROM s.started))" +
	" THEN greatest(1, ceil(extract(epoch FROM s.grace_until - now()) * 1000))::bigint" +
	" ELSE 0 END"

const (
	// qGate is the CTE of every grant statement: its one row's wait_ms
	// (see gateCase) must be 0 for the statement to insert.
	qGate = "gate AS (SELECT " + gateCase + " AS wait_ms FROM (SELECT 1) one LEFT JOIN berth_server s ON s.id = 1)"
	// qGateWait reads the gate alone.
	qGateWait = "WITH " + qGate + " SELECT wait_ms FROM gate"

	// qSync compares the server with the one recorded, and, on another
	// one, records it and starts a grace period of the longest grace of
	// the live sessions and this Store's ($4 ms); it renews this Store's
	// session $1 (of host $2, $3 ms, its process $5 $6 $7 of boot $8),
	// registering it when it is missing: re-asserted for the server $9 (or
	// for this one when $10, a new Store with nothing granted). It returns
	// the server's start time, the recorded one before this statement,
	// whether it recorded a change, the gate's wait after it, the
	// session's acked and whether it was registered now.
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
	// lease rows $8..$12 whose lease has not run out are all in the
	// table, and that the process rows $14..$19, released, are not; when
	// so, it marks session $13 re-asserted for this server. It returns the
	// indexes (from 1) of the missing ones of the first two kinds and of
	// the ones back of the third, the session's new acked (NULL: not
	// marked), the server's start time and the gate's wait.
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

	// qHostSessions reads the other live sessions of host $1 that have
	// not re-asserted for this server, for their owners to be judged.
	qHostSessions = "SELECT session_id, owner_pid, owner_start, owner_scope, boot_id FROM berth_sessions" +
		" WHERE host_id = $1 AND session_id <> $2 AND expires_at > now() AND acked IS DISTINCT FROM pg_postmaster_start_time()"
	// qDropSessions deletes sessions $2 of host $1, whose processes have
	// exited.
	qDropSessions = "DELETE FROM berth_sessions WHERE host_id = $1 AND session_id = ANY($2::text[])"
	// qReleaseAgain deletes the lease rows $1..$4 (protocol, port,
	// address, holder), released lately through this Store.
	qReleaseAgain = "DELETE FROM berth_port_allocations p USING unnest($1::text[], $2::int[], $3::text[], $4::text[]) AS d(proto, port, addr, holder)" +
		" WHERE p.owner_kind = 'lease' AND p.protocol = d.proto AND p.port = d.port AND p.address = d.addr::inet AND p.holder = d.holder"
	// qEndSession deletes session $1: its Store is closed.
	qEndSession = "DELETE FROM berth_sessions WHERE session_id = $1"
	// qReapSessions deletes the sessions whose lease has run out.
	qReapSessions = "DELETE FROM berth_sessions WHERE expires_at < now()"

	// qGraceState reads the record and the gate, for Grace.
	qGraceState = "WITH " + qGate + " SELECT s.started, s.previous, s.changed_at, s.grace_until, gate.wait_ms," +
		" (SELECT count(*) FROM berth_sessions x WHERE x.expires_at > now() AND x.acked IS DISTINCT FROM s.started), now()" +
		" FROM berth_server s CROSS JOIN gate WHERE s.id = 1"
)

// checkGrace validates Options.Grace for a lease of ttl (negative: no
// renewal, 30s taken at Open) and returns it, or its default when zero.
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

// openTTL is the lease of a Store's host and session: ttl, or the 30s
// that Open takes when nothing renews it (ttl negative) or ttl is zero.
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

// graceState is what a Store knows of the server: the one it saw last,
// and the one its session re-asserted for.
type graceState struct {
	seen       atomic.Pointer[time.Time]
	acked      atomic.Pointer[time.Time]
	reassertMu sync.Mutex // one verification at a time
}

// noticeServer notes the server a connection found, by its start time, and
// reports whether it is another than the one seen last: then the holders
// are to compare what they hold with the store (see Check).
func (s *Store) noticeServer(started time.Time) bool {
	prev := s.seen.Swap(&started)
	if prev == nil || prev.Equal(started) {
		return false
	}
	s.noteLoss(fmt.Sprintf("connected to a server that started at %s, not the one of the last connection (started at %s): "+
		"a failover or a restart may have lost the last commits", started.UTC().Format(time.RFC3339Nano), prev.UTC().Format(time.RFC3339Nano)))
	return true
}

// owes reports whether this Store has yet to re-assert for the server it
// saw last.
func (s *Store) owes() bool {
	seen := s.seen.Load()
	if seen == nil {
		return false
	}
	a := s.acked.Load()
	return a == nil || !a.Equal(*seen)
}

// syncResult is what qSync returned.
type syncResult struct {
	started  time.Time
	recorded bool
	wait     int64
}

// sync runs qSync on q: it records a change of server (starting the grace
// period), renews the Store's session (fresh: a new Store, which has
// nothing to re-assert), and notes the server.
func (s *Store) sync(ctx context.Context, q querier, fresh bool) (syncResult, error) {
	var (
		r        syncResult
		prev     *time.Time
		acked    *time.Time
		inserted bool
	)
	err := q.QueryRow(ctx, qSync, s.session, s.host, s.sessTTL.Milliseconds(), s.grace.Milliseconds(),
		s.self.PID, s.self.Start, s.self.Namespace, s.bootID, s.acked.Load(), fresh).
		Scan(&r.started, &prev, &r.recorded, &r.wait, &acked, &inserted)
	if err != nil {
		return r, err
	}
	owed := s.owes()
	changed := s.noticeServer(r.started)
	s.acked.Store(acked)
	if !owed && !changed && s.owes() && !fresh {
		// A change this Store's own connections did not show (another
		// Store recorded it first, or a restore brought back the same
		// server): its holders compare all the same.
		s.noteLoss("the store recorded a change of server, which may have lost the last commits")
	}
	if r.recorded {
		was := "none"
		if prev != nil {
			was = prev.UTC().Format(time.RFC3339Nano)
		}
		s.log.Info("the database is served by another PostgreSQL server than the one recorded (a failover, a restart or a restore, which may have lost the last commits): "+
			"grants are paused until every berth process of the fleet has put back what it holds, or for the grace period at most",
			"started", r.started.UTC().Format(time.RFC3339Nano), "recorded", was, "grace", (time.Duration(r.wait) * time.Millisecond).String(), "host", s.host)
	}
	if inserted && !fresh {
		s.log.Info("this process's session was missing from the store (a change of server lost it) and is registered again", "host", s.host)
	}
	return r, nil
}

// reassert marks the Store's session re-asserted for the server, on q,
// once every reservation granted through it and still held is in the
// table and none released through it lately is (qVerify), and reports
// whether the Store owes nothing now. It first releases again the leases
// released through it lately (releaseAgain). Rows of
// this host's sessions whose processes exited are deleted meanwhile, so
// that they do not hold up the grace period. Once the grace period is
// over, what is still missing was not put back in time: it is logged and
// forgotten. Errors are logged, and reported as false.
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
			pProto, pAddr, pScope, fProto, fAddr, fHolder []string
			pPort, pPID, fPort                            []int32
			pStart                                        []int64
			fExpires                                      []time.Time
			rProto, rAddr, rScope                         []string
			rPort, rPID                                   []int32
			rStart                                        []int64
		)
		for _, r := range released {
			rProto, rPort, rAddr = append(rProto, string(r.Protocol)), append(rPort, int32(r.Port)), append(rAddr, r.Addr.String())
			rPID, rStart, rScope = append(rPID, int32(r.Owner.PID)), append(rStart, r.Owner.Start), append(rScope, r.Owner.Namespace)
		}
		for _, r := range procs {
			pProto, pPort, pAddr = append(pProto, string(r.Protocol)), append(pPort, int32(r.Port)), append(pAddr, r.Addr.String())
			pPID, pStart, pScope = append(pPID, int32(r.Owner.PID)), append(pStart, r.Owner.Start), append(pScope, r.Owner.Namespace)
		}
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
		err := q.QueryRow(ctx, qVerify, s.hostNo(), pProto, pPort, pAddr, pPID, pStart, pScope,
			fProto, fPort, fAddr, fHolder, fExpires, s.session, rProto, rPort, rAddr, rPID, rStart, rScope).
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

// releaseAgain deletes again, on q, the lease rows released through this
// Store lately: a change of server may have brought them back, and they
// would hold their ports, in the way of rows their holders put back, until
// their lease ran out. (A process row released lately and brought back is
// its holder's to release again, as portalloc does: until then the Store
// has not re-asserted, see reassert.) Errors are logged.
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

// reassertNow re-asserts at once if the Store owes it: after a holder put
// a row back.
func (s *Store) reassertNow(ctx context.Context) {
	if !s.owes() {
		return
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	s.reassert(cctx, s.pool)
}

// clearDeadSessions deletes the sessions of this host, not re-asserted
// for the server, whose processes have exited (or are of another boot):
// no holder of theirs will re-assert, and they would hold up the grace
// period until their lease ran out. Errors are logged.
func (s *Store) clearDeadSessions(ctx context.Context, q querier) {
	rows, err := q.Query(ctx, qHostSessions, s.host, s.session)
	if err != nil {
		s.log.V(1).Info("could not read this host's sessions", "host", s.host, "error", s.scrub.String(err.Error()))
		return
	}
	type sess struct {
		id   string
		own  store.Owner
		boot string
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sess, error) {
		var x sess
		err := r.Scan(&x.id, &x.own.PID, &x.own.Start, &x.own.Namespace, &x.boot)
		return x, err
	})
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
	// Left is how long the grace period runs at most, by the server's
	// clock, as of the refusal.
	Left time.Duration
	// Own: this process's own reservations are still being put back; the
	// grant was refused at once rather than waited for, so that its
	// holders can put them back.
	Own bool
	// Blocked: a holder's re-assertion met another row (a row released
	// before the change, which the change brought back and its holder
	// releases again): it is to be tried again.
	Blocked error
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

// waitGrace waits, within ctx, for the grace period a grant met (wait,
// from the gate) to end, and returns nil once the grant may be tried
// again. While this Store has yet to re-assert, it fails at once: its
// process's holders put their rows back between its calls (portalloc
// does so on the call's turn). When ctx ends first, the error wraps both
// store.ErrGrace and ctx's error.
func (s *Store) waitGrace(ctx context.Context, op string, wait int64) error {
	synced := false
	for {
		if wait < 0 || !synced {
			// Another server, not recorded yet, is recorded; and this
			// Store learns whether its session has re-asserted for it
			// (another Store may have recorded the change), registering
			// it again if the change lost it.
			cctx, cancel := s.call(ctx)
			r, err := s.sync(cctx, s.pool, false)
			if err == nil && r.wait != 0 {
				s.clearDeadSessions(cctx, s.pool)
			}
			cancel()
			if err != nil {
				return s.fail(ctx, op, err)
			}
			wait, synced = r.wait, true
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
	if err := s.open(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	var wait int64
	if err := s.pool.QueryRow(cctx, qGateWait).Scan(&wait); err != nil {
		return 0, s.fail(ctx, op, err)
	}
	return wait, nil
}

// watch keeps a connection of its own to the server, idle, until Close:
// when the server goes away (a failover, a restart), it connects again
// every watchRetry until one takes it, records a change of server and
// re-asserts (qSync, then reassert), without waiting for a call of the
// Store or its next lease renewal. While the Store owes a re-assertion it
// tries again every watchRetry.
func (s *Store) watch() {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	pause := func() {
		t := time.NewTimer(watchRetry)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
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
				pause()
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

// closeConn closes a connection of the watch, giving up after a second
// on a server that does not answer.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// endSession deletes the Store's session, at Close, within the Store's
// Timeout.
func (s *Store) endSession() {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, qEndSession, s.session); err != nil {
		s.log.V(1).Info("could not delete this process's session; it ends with its lease", "host", s.host, "error", s.scrub.String(err.Error()))
	}
}

// reapSessions deletes the sessions whose lease has run out. Errors are
// logged: the gate does not count such sessions anyway.
func (s *Store) reapSessions(ctx context.Context) {
	if _, err := s.exec(ctx, "reap ended sessions", qReapSessions); err != nil && ctx.Err() == nil {
		s.log.V(1).Info("could not delete ended sessions", "error", err.Error())
	}
}

// GraceState says whether grants are paused after a change of server.
type GraceState struct {
	// Server is when the server that serves the database started, as
	// recorded; Previous the one before it (zero: none recorded).
	Server, Previous time.Time
	// Changed is when the change was recorded, and Until when the grace
	// period it started ends at the latest (zero: none), by the server's
	// clock.
	Changed, Until time.Time
	// Paused says that grants are held up now: Left more at most.
	Paused bool
	Left   time.Duration
	// Waiting counts the live sessions (open Stores of the fleet) that
	// have not re-asserted for the server.
	Waiting int
	// Now is the server's time as of the reading.
	Now time.Time
}

// Grace reports whether grants are paused after a change of server, and
// until when. It records nothing.
func (s *Store) Grace(ctx context.Context) (GraceState, error) {
	if err := s.open(); err != nil {
		return GraceState{}, fmt.Errorf("read the grace period: %w", err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	var (
		g               GraceState
		prev, until     *time.Time
		wait, waitingNo int64
	)
	err := s.pool.QueryRow(cctx, qGraceState).Scan(&g.Server, &prev, &g.Changed, &until, &wait, &waitingNo, &g.Now)
	if err != nil {
		return GraceState{}, s.fail(ctx, "read the grace period", err)
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

// ledger is what was granted through a Store and not given up through it:
// what the Store checks is in the table again before it re-asserts; and
// what was released through it lately: rows, which it checks are not in
// the table again (a change of server may have undone their release, and
// they would hold their ports in the way of rows other holders put back;
// their holder releases them again), and leases, which it releases again
// itself.
type ledger struct {
	mu        sync.Mutex
	procs     map[procKey]store.Reservation
	leases    map[leaseKey]FleetReservation
	released  map[leaseKey]time.Time
	relProcs  map[procKey]time.Time
	relOwners map[procKey]store.Owner
}

// redoWindow is how long the ledger keeps a lease released, to release it
// again after a change of server.
const redoWindow = 10 * time.Minute

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

// hold records a process row granted.
func (l *ledger) hold(r store.Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.procs == nil {
		l.procs = map[procKey]store.Reservation{}
	}
	k := procKeyOf(r.Key, r.Owner)
	l.procs[k] = r
	delete(l.relProcs, k)
	delete(l.relOwners, k)
}

// release records that own released its row of key.
func (l *ledger) release(r store.Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := procKeyOf(r.Key, r.Owner)
	delete(l.procs, k)
	if l.relProcs == nil {
		l.relProcs, l.relOwners = map[procKey]time.Time{}, map[procKey]store.Owner{}
	}
	l.relProcs[k], l.relOwners[k] = time.Now(), r.Owner
}

// forgetRelease forgets a release of r.
func (l *ledger) forgetRelease(r store.Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := procKeyOf(r.Key, r.Owner)
	delete(l.relProcs, k)
	delete(l.relOwners, k)
}

// releasedRowsLately returns the process rows released within
// redoWindow, and forgets the older ones.
func (l *ledger) releasedRowsLately() []store.Reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []store.Reservation
	for k, at := range l.relProcs {
		if time.Since(at) > redoWindow {
			delete(l.relProcs, k)
			delete(l.relOwners, k)
			continue
		}
		out = append(out, store.Reservation{Key: k.key, Owner: l.relOwners[k]})
	}
	return out
}

// drop forgets own's row of key: transferred, or given up.
func (l *ledger) drop(k store.Key, own store.Owner) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.procs, procKeyOf(k, own))
}

// lease records a lease row granted or renewed.
func (l *ledger) lease(r FleetReservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leases == nil {
		l.leases = map[leaseKey]FleetReservation{}
	}
	l.leases[leaseKey{r.Key, r.Holder}] = r
	delete(l.released, leaseKey{r.Key, r.Holder})
}

// releaseLease records that holder released its lease row of key.
func (l *ledger) releaseLease(k store.Key, holder string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.leases, leaseKey{k, holder})
	if l.released == nil {
		l.released = map[leaseKey]time.Time{}
	}
	l.released[leaseKey{k, holder}] = time.Now()
}

// releasedLately returns the leases released within redoWindow, and
// forgets the older ones.
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

// unlease forgets holder's lease row of key.
func (l *ledger) unlease(k store.Key, holder string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.leases, leaseKey{k, holder})
}

// narrow records that holder's lease row of key is host's now.
func (l *ledger) narrow(k store.Key, holder, host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.leases[leaseKey{k, holder}]; ok {
		r.Host = host
		l.leases[leaseKey{k, holder}] = r
	}
}

// leaseOf returns holder's lease row of key as granted, renewed or
// narrowed through the Store, and whether there is one.
func (l *ledger) leaseOf(k store.Key, holder string) (FleetReservation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.leases[leaseKey{k, holder}]
	return r, ok
}

// snapshot returns what the ledger holds, the process rows of owners that
// exited left out (and forgotten).
func (l *ledger) snapshot(ctx context.Context) ([]store.Reservation, []FleetReservation) {
	l.mu.Lock()
	procs := make([]store.Reservation, 0, len(l.procs))
	for _, r := range l.procs {
		procs = append(procs, r)
	}
	leases := make([]FleetReservation, 0, len(l.leases))
	for _, r := range l.leases {
		leases = append(leases, r)
	}
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
