package pgstore_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

var lo4 = netip.MustParseAddr("127.0.0.1")

// changeServer makes the test's schema look served by another server than
// the one it recorded, as a restore from backup leaves it: the record
// names a server that started a day earlier, for which every session had
// re-asserted. The server itself is the shared test server, unchanged:
// the failover tests change it for real.
func changeServer(tb testing.TB, conn *pgx.Conn) {
	tb.Helper()
	ctx := context.Background()
	for _, q := range []string{
		"UPDATE berth_server SET started = started - interval '1 day'",
		"UPDATE berth_sessions SET acked = (SELECT started FROM berth_server)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			tb.Fatal(err)
		}
	}
}

// graceWait is how long a grant that a grace period holds is let wait: long
// enough for a round trip on a busy machine, well within the grace periods
// of these tests (15 s and more, but for the one that only reads it).
const graceWait = 2 * time.Second

// paused reserves key for s within graceWait and reports whether that
// was held up by a grace period until the context ended.
func paused(tb testing.TB, s *pgstore.Store, k store.Key) error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), graceWait)
	defer cancel()
	_, err := s.Reserve(ctx, store.Request{Key: k})
	return err
}

// isWait reports whether err is a grant that waited out its context in a
// grace period: ErrGrace and the deadline, and nothing the store failed
// at.
func isWait(err error) bool {
	return errors.Is(err, store.ErrGrace) && errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, store.ErrStorage) && !errors.Is(err, store.ErrUnavailable)
}

// TestGraceNoChange: a database whose server has not changed since its
// first record (made by the migration that made the table) pauses
// nothing: no grace period, grants at once.
func TestGraceNoChange(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "gn-a"})
	b := openWith(t, dsn, pgstore.Options{Host: "gn-b"})
	reserveN(t, a, 56750, 3)
	g, err := b.Grace(ctx)
	if err != nil || g.Paused || !g.Previous.IsZero() || !g.Until.IsZero() || g.Waiting != 0 {
		t.Fatalf("Grace of a fresh database = %+v, %v; want none ever", g, err)
	}
	var same bool
	if err := conn.QueryRow(ctx, "SELECT started = pg_postmaster_start_time() FROM berth_server").Scan(&same); err != nil || !same {
		t.Errorf("the recorded server is this one: %v, %v; want true", same, err)
	}
	// Every kind of grant goes through at once, even with a context that
	// could not wait at all.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Reserve(done, store.Request{Key: key(store.TCP, "127.0.0.1", 56750)}); err == nil || errors.Is(err, store.ErrGrace) {
		t.Errorf("Reserve with a context already ended = %v; want the context's error, not a pause", err)
	}
	for _, s := range []*pgstore.Store{a, b} {
		if err := s.Check(ctx); err != nil {
			t.Errorf("%s: Check = %v; want nil", s.Host(), err)
		}
	}
	reserveN(t, b, 56750, 1)
	if _, err := b.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 56760, Last: 56769}, Holder: "pod/gn"}); err != nil {
		t.Errorf("ReserveFleet = %v", err)
	}
}

// TestGraceAfterChange: once the database is served by another server,
// the first transaction that finds it records it and starts the grace
// period. Every grant of a port that is not the asker's waits for it
// (Reserve, Scan, ScanBlock, ReserveFleet, ReserveFleetSet), or is refused
// at once in a process that has yet to put its own rows back; holders put
// theirs back (Restore, RenewFleet); the period ends, before its end, once
// every live Store has its rows back.
func TestGraceAfterChange(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	var logA logBuf
	a := openWith(t, dsn, pgstore.Options{Host: "gc-a", Logger: logA.logger()})
	b := openWith(t, dsn, pgstore.Options{Host: "gc-b"})
	reserveN(t, a, 56700, 2)
	reserveN(t, b, 56710, 2)
	lease, err := b.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 56790, Last: 56790}, Holder: "pod/gc", Label: "web"})
	if err != nil {
		t.Fatal(err)
	}

	// The change loses one of gc-b's rows and the lease it granted.
	changeServer(t, conn)
	if _, err := conn.Exec(ctx, "DELETE FROM berth_port_allocations WHERE port IN (56711, 56790)"); err != nil {
		t.Fatal(err)
	}
	// gc-a's rows are all there: its grant waits, for gc-b.
	if err := paused(t, a, key(store.TCP, "127.0.0.1", 56702)); !isWait(err) {
		t.Fatalf("gc-a: Reserve in the grace period = %v; want ErrGrace once its context ended", err)
	}
	g, err := a.Grace(ctx)
	if err != nil || !g.Paused || g.Previous.IsZero() || g.Waiting != 1 || g.Until.Sub(g.Changed) != 15*time.Second {
		t.Fatalf("Grace after the change = %+v, %v; want paused for 15s at most (a third of the 30s lease and 5s), waiting for gc-b", g, err)
	}
	if got := logA.find("another PostgreSQL server than the one recorded"); len(got) != 1 {
		t.Errorf("gc-a's log = %q; want the change recorded once", logA.lines)
	}
	if err := a.Check(ctx); !errors.Is(err, store.ErrLost) {
		t.Errorf("gc-a: Check after the change = %v; want ErrLost", err)
	}
	// A key the asker holds is no grant: it is its own.
	if r, err := a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56700)}); err != nil || r.Port != 56700 {
		t.Errorf("gc-a: Reserve of its own key in the grace period = %v, %v; want its row", r, err)
	}
	// Every other kind of grant waits too.
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, graceWait) }
	for name, grant := range map[string]func(context.Context) error{
		"Scan": func(ctx context.Context) error {
			next := 56720
			_, err := a.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: func() (uint16, bool) { next++; return uint16(next), next < 56730 }})
			return err
		},
		"ScanBlock": func(ctx context.Context) error {
			next := 56720
			_, err := a.ScanBlock(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: func() (uint16, bool) { next++; return uint16(next), next < 56730 }}, 2)
			return err
		},
		"ReserveFleet": func(ctx context.Context) error {
			_, err := a.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 56780, Last: 56789}, Holder: "pod/gc2"})
			return err
		},
		"ReserveFleetSet": func(ctx context.Context) error {
			_, err := a.ReserveFleetSet(ctx, []pgstore.FleetRequest{{Protocol: store.TCP, Band: store.Range{First: 56780, Last: 56789}, Holder: "job/gc"},
				{Protocol: store.UDP, Band: store.Range{First: 56780, Last: 56789}, Holder: "job/gc"}})
			return err
		},
	} {
		c, cancel := short()
		if err := grant(c); !isWait(err) {
			t.Errorf("gc-a: %s in the grace period = %v; want ErrGrace once its context ended", name, err)
		}
		cancel()
	}
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations").Scan(&rows); err != nil || rows != 3 {
		t.Errorf("rows after the grants held up = %d, %v; want the 3 left by the change", rows, err)
	}

	// gc-b has yet to put its row back: its grants are refused at once,
	// so that its holders can (portalloc does on the call's turn).
	_, err = b.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56712)})
	if !errors.Is(err, store.ErrGrace) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "while this process puts back") {
		t.Errorf("gc-b: Reserve in the grace period before it put its rows back = %v; want ErrGrace at once", err)
	}
	if err := b.Check(ctx); !errors.Is(err, store.ErrLost) {
		t.Errorf("gc-b: Check after the change = %v; want ErrLost", err)
	}
	// A lease not granted through the Store is not put back by a renewal;
	// one granted through it is.
	if err := a.RenewFleet(ctx, lease.Key, lease.Holder, time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("gc-a: RenewFleet of a lease not granted through it, in the grace period = %v; want ErrNotFound", err)
	}
	if err := b.RenewFleet(ctx, lease.Key, lease.Holder, time.Minute); err != nil {
		t.Errorf("gc-b: RenewFleet of the lease it granted that the change lost, in the grace period = %v; want it put back", err)
	}
	if ls, err := a.Leases(ctx); err != nil || len(ls) != 1 || ls[0].Port != 56790 || ls[0].Label != "web" || ls[0].Host != "" {
		t.Errorf("Leases after the renewal = %+v, %v; want pod/gc's fleet-wide lease of 56790 labelled web back", ls, err)
	}
	if _, err := b.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56711), Restore: true}); err != nil {
		t.Fatalf("gc-b: Reserve with Restore in the grace period = %v; want its row back", err)
	}
	// Every Store has its rows back: grants go on before the period's
	// end.
	reserveN(t, a, 56702, 1)
	reserveN(t, b, 56712, 1)
	if g, err := a.Grace(ctx); err != nil || g.Paused || !g.Now.Before(g.Until) || g.Waiting != 0 {
		t.Errorf("Grace once every Store re-asserted = %+v, %v; want it over before its end", g, err)
	}
	// Outside a grace period a lost lease stays lost: its renewal is
	// refused.
	if _, err := conn.Exec(ctx, "DELETE FROM berth_port_allocations WHERE port = 56790"); err != nil {
		t.Fatal(err)
	}
	if err := b.RenewFleet(ctx, lease.Key, lease.Holder, time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("gc-b: RenewFleet of a lease gone outside a grace period = %v; want ErrNotFound", err)
	}
}

// TestGraceSessions: the grace period lasts the longest grace of the live
// Stores; a live Store of another host that has not re-asserted holds it
// up until it does or its lease ends; a Store of this host whose process
// exited does not, since the host's own Stores delete its session.
func TestGraceSessions(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "gs-a"})
	reserveN(t, a, 56800, 1)
	dead, stop := child(t)
	stop()
	live, _ := child(t)
	const ins = "INSERT INTO berth_sessions (session_id, host_id, owner_pid, owner_start, owner_scope, expires_at, grace_ms, acked)" +
		" VALUES ($1, $2, $3, $4, $5, now() + interval '1 hour', $6, NULL)"
	for _, s := range []struct {
		id, host string
		own      store.Owner
		ms       int64
	}{{"dead", "gs-a", dead, 1000}, {"other", "gs-b", live, 60000}} {
		if _, err := conn.Exec(ctx, ins, s.id, s.host, s.own.PID, s.own.Start, s.own.Namespace, s.ms); err != nil {
			t.Fatal(err)
		}
	}
	changeServer(t, conn)
	if err := paused(t, a, key(store.TCP, "127.0.0.1", 56801)); !isWait(err) {
		t.Fatalf("Reserve while gs-b's Store has not re-asserted = %v; want ErrGrace once its context ended", err)
	}
	g, err := a.Grace(ctx)
	if err != nil || !g.Paused || g.Waiting != 1 || g.Until.Sub(g.Changed) != time.Minute {
		t.Errorf("Grace = %+v, %v; want paused for 1m at most (gs-b's grace), waiting for gs-b alone", g, err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_sessions WHERE session_id = 'dead'").Scan(&n); err != nil || n != 0 {
		t.Errorf("sessions of gs-a's exited process = %d, %v; want it deleted", n, err)
	}
	// gs-b's lease ends: it no longer holds the period up.
	if _, err := conn.Exec(ctx, "UPDATE berth_sessions SET expires_at = now() WHERE session_id = 'other'"); err != nil {
		t.Fatal(err)
	}
	reserveN(t, a, 56801, 1)
	if g, err := a.Grace(ctx); err != nil || g.Paused || !g.Now.Before(g.Until) {
		t.Errorf("Grace once gs-b's lease ended = %+v, %v; want it over", g, err)
	}
	// Its sweep deletes sessions whose lease has ended.
	if _, err := a.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_sessions").Scan(&n); err != nil || n != 1 {
		t.Errorf("sessions after Reap = %d, %v; want gs-a's alone", n, err)
	}
	// Close deletes the Store's session.
	_ = a.Close()
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_sessions").Scan(&n); err != nil || n != 0 {
		t.Errorf("sessions after Close = %d, %v; want none", n, err)
	}
}

// TestGraceRecordLost: a database whose record is gone (deleted by hand)
// is as one served by an unknown server: the next grant records this one
// and starts a grace period, which ends once every Store has re-asserted
// and a second has passed.
func TestGraceRecordLost(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "gr-a"})
	reserveN(t, a, 56820, 1)
	if _, err := conn.Exec(ctx, "DELETE FROM berth_server"); err != nil {
		t.Fatal(err)
	}
	// Within the floor: this grace period ends as soon as a second has
	// passed, gr-a being the only Store.
	short, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
	_, err := a.Reserve(short, store.Request{Key: key(store.TCP, "127.0.0.1", 56821)})
	cancel()
	if !isWait(err) {
		t.Fatalf("Reserve right after the record was lost = %v; want ErrGrace once its context ended (a grace period lasts a second at least)", err)
	}
	reserveN(t, a, 56821, 1)
	g, err := a.Grace(ctx)
	if err != nil || g.Paused || g.Until.IsZero() || !g.Previous.IsZero() {
		t.Errorf("Grace = %+v, %v; want a grace period recorded, over, with no previous server", g, err)
	}
}

// TestGraceGivesUp: a row a Store granted that nobody puts back within the
// grace period is given up once it ends: the Store logs it and re-asserts
// without it, and is not held up by it at the next change.
func TestGraceGivesUp(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	var logA logBuf
	a := openWith(t, dsn, pgstore.Options{Host: "gg-a", Logger: logA.logger()})
	reserveN(t, a, 56840, 2)
	changeServer(t, conn)
	if _, err := conn.Exec(ctx, "DELETE FROM berth_port_allocations WHERE port = 56841"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56842)}); !errors.Is(err, store.ErrGrace) {
		t.Fatalf("Reserve before gg-a put its row back = %v; want ErrGrace", err)
	}
	// The period ends with the row still missing.
	if _, err := conn.Exec(ctx, "UPDATE berth_server SET grace_until = now()"); err != nil {
		t.Fatal(err)
	}
	reserveN(t, a, 56842, 1)
	if err := a.RenewLease(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := logA.find("not put back before the grace period", "56841"); len(got) != 1 {
		t.Errorf("gg-a's log = %q; want the row given up, once", logA.lines)
	}
	// The next change waits for nothing gg-a gave up.
	changeServer(t, conn)
	reserveN(t, a, 56843, 1)
}

// TestGraceOptions: Options.Grace is at least a third of the lease plus 2s
// and at most 10 minutes; zero is a third of the lease plus 5s.
func TestGraceOptions(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	for _, o := range []pgstore.Options{
		{Host: "go", Grace: time.Second},
		{Host: "go", LeaseTTL: time.Minute, Grace: 21 * time.Second},
		{Host: "go", Grace: 11 * time.Minute},
		{Host: "go", Grace: -time.Second},
	} {
		s, err := pgstore.Open(ctx, dsn, o)
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != "grace" {
			if s != nil {
				_ = s.Close()
			}
			t.Errorf("Open with LeaseTTL %v, Grace %v = %v; want a *FieldError for grace", o.LeaseTTL, o.Grace, err)
		}
	}
	a := openWith(t, dsn, pgstore.Options{Host: "go", LeaseTTL: 3 * time.Second, Grace: 3 * time.Second, SweepInterval: -1})
	b := openWith(t, dsn, pgstore.Options{Host: "go2", LeaseTTL: time.Minute, SweepInterval: -1})
	changeServer(t, conn)
	_ = paused(t, a, key(store.TCP, "127.0.0.1", 56860))
	g, err := a.Grace(ctx)
	if err != nil || g.Until.Sub(g.Changed) != 25*time.Second {
		t.Errorf("Grace = %+v, %v; want 25s at most: go2's default, a third of its minute and 5s", g, err)
	}
	// Both re-assert (go2 at its next connection, which Grace's call
	// made, or its watch's): the period ends.
	reserveN(t, b, 56861, 1)
	reserveN(t, a, 56860, 1)
}

// TestGraceReleaseUndone: a release that the change of server undid puts
// the row back in the way of others: until its holder releases it again,
// its Store has not re-asserted, and its own grants are refused at once
// (so that its holders, which portalloc runs between its calls, can).
func TestGraceReleaseUndone(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "gu-a"})
	reserveN(t, a, 56880, 2)
	// The row as it was, to bring it back as a change would.
	var row []any
	rows, err := conn.Query(ctx, "SELECT host_no, protocol, port, address, owner_pid, owner_start, owner_scope FROM berth_port_allocations WHERE port = 56880")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		if row, err = rows.Values(); err != nil {
			t.Fatal(err)
		}
	}
	if rows.Err() != nil || len(row) != 7 {
		t.Fatalf("the row of 56880: %v, %v", row, rows.Err())
	}
	k := key(store.TCP, "127.0.0.1", 56880)
	if err := a.Release(ctx, k, store.Owner{}); err != nil {
		t.Fatal(err)
	}
	changeServer(t, conn)
	if _, err := conn.Exec(ctx, "INSERT INTO berth_port_allocations (host_no, protocol, port, address, owner_pid, owner_start, owner_scope, kind)"+
		" VALUES ($1, $2, $3, $4, $5, $6, $7, 'static')", row...); err != nil {
		t.Fatal(err)
	}
	_, err = a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56882)})
	if !errors.Is(err, store.ErrGrace) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Reserve while a release of this Store's is undone = %v; want ErrGrace at once", err)
	}
	// Its own key, back, is not handed to it either: its holder released it.
	if _, err := a.Reserve(ctx, store.Request{Key: k}); !errors.Is(err, store.ErrGrace) {
		t.Errorf("Reserve of the key whose release was undone = %v; want ErrGrace", err)
	}
	if err := a.Release(ctx, k, store.Owner{}); err != nil {
		t.Fatalf("Release again of the row the change brought back = %v", err)
	}
	reserveN(t, a, 56882, 1)
	if g, err := a.Grace(ctx); err != nil || g.Paused {
		t.Errorf("Grace once the release was done again = %+v, %v; want over", g, err)
	}
}
