package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/pgserver"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// startPair starts a primary and a streaming standby of the test's own
// (initdb, pg_basebackup -R), on unix sockets only, stopped and deleted
// when the test ends; berth reaches them through one multi-host
// connection string with target_session_attrs=read-write, as an
// operator's fleet does. With sync the primary waits at every commit for
// the standby (synchronous_standby_names).
func startPair(tb testing.TB, sync bool) *pgserver.Pair {
	tb.Helper()
	if os.Getenv(envDSN) == "" {
		tb.Skipf("set %s to run the pgstore tests (bash .ci/postgres start prints one); the failover tests start servers of their own with the same binaries", envDSN)
	}
	root, err := os.MkdirTemp("", "berth-fo.") // short: a socket path has ~100 bytes
	if err != nil {
		tb.Fatal(err)
	}
	_ = os.Remove(root) // pgserver makes it, for the servers' user
	c, err := pgserver.New(root)
	if errors.Is(err, pgserver.ErrNotInstalled) || errors.Is(err, pgserver.ErrNoUser) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			// The servers' logs say what the servers did.
			logs, _ := filepath.Glob(filepath.Join(root, "*.log"))
			for _, l := range logs {
				if b, err := os.ReadFile(l); err == nil {
					tb.Logf("%s:\n%s", filepath.Base(l), tail(b, 4096))
				}
			}
		}
		if err := c.Close(context.Background()); err != nil {
			tb.Errorf("stop the failover test's servers: %v", err)
		}
	})
	c.Sync = sync
	pair, err := c.StartPair(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return pair
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte { return b[max(0, len(b)-n):] }

// connect connects to one server of a pair, closed when tb ends.
func connect(tb testing.TB, s *pgserver.Server) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), s.DSN())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// holdBack stops the standby's WAL receiver: the primary's next commits
// do not reach it, as when an asynchronous standby lags.
func holdBack(tb testing.TB, standby *pgserver.Server) {
	tb.Helper()
	ctx := context.Background()
	s := connect(tb, standby)
	for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := s.Exec(ctx, q); err != nil {
			tb.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		var n int
		if err := s.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n); err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("the standby's WAL receiver did not stop in 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ports returns the ports of s's process rows.
func ports(tb testing.TB, s *pgstore.Store) []uint16 {
	tb.Helper()
	rs, err := s.List(context.Background(), store.Filter{})
	if err != nil {
		tb.Fatalf("%s: List: %v", s.Host(), err)
	}
	var out []uint16
	for _, r := range rs {
		out = append(out, r.Port)
	}
	return out
}

// settle calls List on s until a call succeeds: the calls on connections
// that died with the old primary fail, the next ones connect to the new
// one. It fails the test after 25s.
func settle(tb testing.TB, s *pgstore.Store) {
	tb.Helper()
	for deadline := time.Now().Add(25 * time.Second); ; {
		_, err := s.List(context.Background(), store.Filter{})
		if err == nil {
			return
		}
		if !errors.Is(err, store.ErrStorage) {
			tb.Fatalf("%s: List after the failover = %v; want nil or ErrStorage", s.Host(), err)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: List 25s after the failover = %v", s.Host(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFailoverAsyncStandby: the primary dies and an asynchronous standby
// that had not received its last commits is promoted. Through the same
// multi-host DSN, each store's next connection goes to the new primary:
// the grants, releases and the host registration made after the standby
// fell behind are gone. Each store notices the other server on its first
// new connection, records it and reports it through Check, so that its
// holders put back what they hold; a host whose registration was lost is
// registered again under the number its store has cached. Meanwhile the
// grace period holds every new grant, of every store, new ones included,
// until each store has its holders' rows back: a holder's own rows
// (Request.Restore) are taken back at once.
func TestFailoverAsyncStandby(t *testing.T) { testFailover(t, false) }

// TestFailoverSyncStandby: the same with a synchronous standby: nothing is
// lost, and the stores still report the other server, since nothing but
// the server's configuration tells a holder that nothing was lost; the
// grace period still starts, and ends as soon as the stores have
// connected to the new server and found their rows there.
func TestFailoverSyncStandby(t *testing.T) { testFailover(t, true) }

func testFailover(t *testing.T, sync bool) { //nolint:thelper // the body of the two tests above
	ctx := context.Background()
	pair := startPair(t, sync)
	dsn := pair.DSN()
	a := openWith(t, dsn, pgstore.Options{Host: "fo-a"})
	reserveN(t, a, 56600, 2)
	if err := pair.WaitStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	if !sync {
		holdBack(t, pair.Standby)
	}

	// Commits an asynchronous standby never receives.
	reserveN(t, a, 56602, 1)
	if err := a.Release(ctx, key(store.TCP, "127.0.0.1", 56600), store.Owner{}); err != nil {
		t.Fatal(err)
	}
	b := openWith(t, dsn, pgstore.Options{Host: "fo-b"})
	reserveN(t, b, 56610, 1)
	noB := hostNo(t, connect(t, pair.Primary), "fo-b")
	for _, s := range []*pgstore.Store{a, b} {
		if err := s.Check(ctx); err != nil {
			t.Fatalf("%s: Check before the failover = %v; want nil", s.Host(), err)
		}
	}
	if g, err := a.Grace(ctx); err != nil || g.Paused || !g.Previous.IsZero() {
		t.Fatalf("Grace before the failover = %+v, %v; want no pause and no change recorded", g, err)
	}

	// The primary dies as in a crash (nothing more is flushed or
	// shipped), and the standby is promoted.
	if err := pair.Primary.Stop(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	if err := pair.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	np := connect(t, pair.Standby)
	if got := hostNo(t, np, "fo-b"); sync != (got == noB) {
		t.Fatalf("fo-b on the promoted standby is number %d (it was %d); want it there only with a synchronous standby", got, noB)
	}

	settle(t, a)
	settle(t, b)
	wantA := []uint16{56600, 56601} // its grant lost, its release undone
	if sync {
		wantA = []uint16{56601, 56602}
	}
	if got := ports(t, a); !slices.Equal(got, wantA) {
		t.Errorf("fo-a's rows on the new primary = %v; want %v", got, wantA)
	}
	err := a.Check(ctx)
	if !errors.Is(err, store.ErrLost) || !strings.Contains(err.Error(), "not the one of the last connection") {
		t.Errorf("fo-a: Check after the failover = %v; want ErrLost for a connection to another server", err)
	}
	if err := a.Check(ctx); err != nil {
		t.Errorf("fo-a: Check once it said so = %v; want nil", err)
	}
	g, err := a.Grace(ctx)
	if err != nil || g.Previous.IsZero() || g.Server.Equal(g.Previous) || g.Until.IsZero() {
		t.Fatalf("Grace after the failover = %+v, %v; want the change recorded, with a grace period", g, err)
	}
	if sync {
		// Nothing was lost: each store found its rows at once.
		reserveN(t, a, 56603, 1)
		if g, err := a.Grace(ctx); err != nil || g.Paused || !g.Now.Before(g.Until) || g.Waiting != 0 {
			t.Errorf("Grace once a grant went through = %+v, %v; want it over before its end, every store re-asserted", g, err)
		}
		if err := a.Release(ctx, key(store.TCP, "127.0.0.1", 56600), store.Owner{}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("fo-a: Release again after the failover = %v; want ErrNotFound: the release was kept", err)
		}
		if got := ports(t, b); !slices.Equal(got, []uint16{56610}) {
			t.Errorf("fo-b's rows on the new primary = %v; want [56610]", got)
		}
		return
	}

	// fo-a and fo-b have yet to put their rows back: the grace period
	// holds every grant, and fo-b's session, lost with its registration,
	// is registered again.
	if !g.Paused || g.Waiting != 2 {
		t.Errorf("Grace after the stores reconnected = %+v; want paused, waiting for fo-a and fo-b", g)
	}
	// A grant of fo-a's, which has yet to put back its own row, is
	// refused at once, so that its holders can.
	start := time.Now()
	_, err = a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56604)})
	if !errors.Is(err, store.ErrGrace) || errors.Is(err, store.ErrStorage) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("fo-a: Reserve of a new port in the grace period = %v; want ErrGrace at once", err)
	}
	t.Logf("refused at once (in %v): %v", time.Since(start).Round(time.Millisecond), err)
	// Its holder puts its row back (portalloc does so with Restore); the
	// release it redoes is no grant.
	if _, err := a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56602), Restore: true}); err != nil {
		t.Fatalf("fo-a: Reserve with Restore in the grace period = %v; want its row back", err)
	}
	if err := a.Release(ctx, key(store.TCP, "127.0.0.1", 56600), store.Owner{}); err != nil {
		t.Errorf("fo-a: Release again after the failover = %v; want its release done again", err)
	}
	if got := ports(t, a); !slices.Equal(got, []uint16{56601, 56602}) {
		t.Errorf("fo-a's rows once its holders compared = %v; want [56601 56602]", got)
	}
	// fo-b has not put its row back: a grant waits, within its context,
	// whoever asks, a store opened now included.
	c := openWith(t, dsn, pgstore.Options{Host: "fo-c"})
	if got := hostNo(t, np, "fo-c"); got == noB || got == 0 {
		t.Errorf("fo-c registered after the failover as number %d; want a new one, not fo-b's %d", got, noB)
	}
	for _, s := range []*pgstore.Store{a, c} {
		short, cancel := context.WithTimeout(ctx, graceWait)
		_, err := s.Reserve(short, store.Request{Key: key(store.TCP, "127.0.0.1", 56610)})
		cancel()
		if !errors.Is(err, store.ErrGrace) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: Reserve of fo-b's lost port while fo-b has not put it back = %v; want ErrGrace once its context ended", s.Host(), err)
		}
		if err := s.RenewFleet(ctx, key(store.TCP, "0.0.0.0", 56699), "pod/x", time.Minute); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: RenewFleet in the grace period of a lease never granted through it = %v; want ErrNotFound", s.Host(), err)
		}
	}
	if got := rowsOf(t, np, "fo-a") + rowsOf(t, np, "fo-c"); got != 2 {
		t.Errorf("rows of fo-a and fo-c after the refused grants = %d; want fo-a's 2", got)
	}

	if got := hostNo(t, np, "fo-b"); got != noB {
		t.Errorf("fo-b on the new primary after its store reconnected is number %d; want %d, the one it had", got, noB)
	}
	err = b.Check(ctx)
	lostReg := strings.Contains(fmt.Sprint(err), `host "fo-b" was missing from the store`)
	if !errors.Is(err, store.ErrLost) || !lostReg {
		t.Errorf("fo-b: Check after the failover = %v; want ErrLost for its lost registration", err)
	}
	if got := ports(t, b); len(got) != 0 {
		t.Errorf("fo-b's rows on the new primary = %v; want none", got)
	}
	if _, err := b.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56610), Restore: true}); err != nil {
		t.Fatalf("fo-b: Reserve with Restore in the grace period = %v; want its row back", err)
	}
	if got := rowsOf(t, np, "fo-b"); got != 1 {
		t.Errorf("fo-b's rows after it put its grant back = %d; want 1", got)
	}
	// Every store has its rows back: the grace period is over, before
	// its end, and the grants go on; another process of fo-b asking for
	// its port is refused, naming its holder.
	other, _ := child(t)
	_, err = b.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56610), Owner: other})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != os.Getpid() {
		t.Errorf("another process of fo-b: Reserve of fo-b's port once it is back = %v; want a conflict naming its holder", err)
	}
	reserveN(t, c, 56620, 1)
	if g, err := a.Grace(ctx); err != nil || g.Paused || !g.Now.Before(g.Until) || g.Waiting != 0 {
		t.Errorf("Grace once every store re-asserted = %+v, %v; want it over before its end", g, err)
	}
}
