package pgserver_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/pgserver"
)

// newCluster makes a Cluster in a short temporary directory, closed when
// the test ends, or skips where PostgreSQL cannot be run.
func newCluster(tb testing.TB) *pgserver.Cluster {
	tb.Helper()
	root, err := os.MkdirTemp("", "pgs.")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.Remove(root); err != nil { // New makes it, for the servers' user
		tb.Fatal(err)
	}
	c, err := pgserver.New(root)
	if errors.Is(err, pgserver.ErrNotInstalled) || errors.Is(err, pgserver.ErrNoUser) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			tb.Error(err)
		}
		if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
			tb.Errorf("Close left %s: %v", root, err)
		}
	})
	return c
}

// write inserts n into a table of the server dsn reaches (made if need
// be) and returns how many rows the table has.
func write(tb testing.TB, dsn string, n int) int {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (n int)"); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1)", n); err != nil {
		tb.Fatal(err)
	}
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&rows); err != nil {
		tb.Fatal(err)
	}
	return rows
}

// TestFailoverTwice: a synchronous pair fails over, gets a new standby,
// and fails over again, back to the first server's place; the pair's one
// connection string reaches the writable server each time, and nothing
// committed is lost.
func TestFailoverTwice(t *testing.T) {
	c := newCluster(t)
	c.Sync, c.MaxConnections = true, 20
	ctx := context.Background()
	p, err := c.StartPair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dsn, first := p.DSN(), p.Primary.Name
	if got := write(t, dsn, 1); got != 1 {
		t.Fatalf("rows = %d; want 1", got)
	}
	for i := 2; i <= 3; i++ {
		killed, promoted := false, false
		if err := p.Failover(ctx, true, func() { killed = true }, func() { promoted = killed }); err != nil {
			t.Fatal(err)
		}
		if !killed || !promoted {
			t.Errorf("failover %d: killed %v, then promoted %v; want both, in that order", i-1, killed, promoted)
		}
		if p.DSN() != dsn {
			t.Errorf("failover %d: DSN %q; want the same %q", i-1, p.DSN(), dsn)
		}
		if got := write(t, dsn, i); got != i {
			t.Fatalf("failover %d: rows = %d; want %d: a synchronous standby loses nothing", i-1, got, i)
		}
	}
	if p.Primary.Name != first {
		t.Errorf("primary after two failovers = %s; want %s, the first one's place", p.Primary.Name, first)
	}
}

// TestRestart: a restarted server keeps what was committed.
func TestRestart(t *testing.T) {
	c := newCluster(t)
	s, err := c.StartOne(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	write(t, s.DSN(), 1)
	if err := s.Restart(context.Background(), "fast"); err != nil {
		t.Fatal(err)
	}
	if got := write(t, s.DSN(), 2); got != 2 {
		t.Errorf("rows after a restart = %d; want 2", got)
	}
}
