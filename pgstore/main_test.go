package pgstore_test

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// pw is the password of the tests that check it is never shown.
const pw = "Sekr3t-PW-9f2"

// envDSN names the PostgreSQL database the tests use; each test works in
// a schema of its own there, dropped when it ends.
const envDSN = "BERTH_TEST_POSTGRES"

// The test binary doubles as an owner process: in the role "sleep" it
// waits for its stdin to close and exits.
func TestMain(m *testing.M) {
	testproc.Register("sleep", func() int {
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	})
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}

// testDB returns a DSN for a schema of this test's own, and a connection
// to it for checks in raw SQL. It skips the test when BERTH_TEST_POSTGRES
// is not set.
func testDB(tb testing.TB) (string, *pgx.Conn) {
	tb.Helper()
	base := os.Getenv(envDSN)
	if base == "" {
		tb.Skipf("set %s to a PostgreSQL DSN to run the pgstore tests, e.g. %s='host=/tmp/pgsock dbname=postgres user=postgres' (bash .ci/postgres start prints one)", envDSN, envDSN)
	}
	ctx := context.Background()
	dsn, drop, err := pgschema.Create(ctx, base, "berth_test")
	if err != nil {
		tb.Fatalf("%s: %v", envDSN, err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("drop the test's schema: %v", err)
		}
	})
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(ctx) })
	return dsn, conn
}

// open opens a Store on dsn for host, closed when the test ends.
func open(tb testing.TB, dsn, host string) *pgstore.Store {
	tb.Helper()
	s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Host: host, SweepInterval: -1})
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// child starts a process of this host and returns its identity and a
// function that ends it and waits for it to be gone.
func child(tb testing.TB) (store.Owner, func()) {
	tb.Helper()
	cmd := testproc.Command(tb, "sleep")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	own, err := store.LookupOwner(context.Background(), cmd.Process.Pid)
	if err != nil {
		tb.Fatal(err)
	}
	done := false
	stop := func() {
		if done {
			return
		}
		done = true
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	tb.Cleanup(stop)
	return own, stop
}
