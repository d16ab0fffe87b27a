package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// conformance reaches a schema of its own through a DSN whose search_path
// names it. The schema version is the row of berth_schema_migrations there.
var conformance = storetest.Config{
	Open: func(t *testing.T) (store.Store, string) {
		t.Helper()
		dsn, _ := testDB(t)
		s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Host: "conformance"})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s, dsn
	},
	Reopen: func(ctx context.Context, dsn string) (store.Store, error) {
		return pgstore.Open(ctx, dsn, pgstore.Options{Host: "conformance"})
	},
	SchemaVersion: func(tb testing.TB, dsn string) uint {
		tb.Helper()
		var v int64
		if err := conformanceConn(tb, dsn).QueryRow(context.Background(), "SELECT version FROM berth_schema_migrations").Scan(&v); err != nil {
			tb.Fatalf("read the schema version: %v", err)
		}
		return uint(v)
	},
	SetSchemaVersion: func(tb testing.TB, dsn string, v uint) {
		tb.Helper()
		if _, err := conformanceConn(tb, dsn).Exec(context.Background(), "UPDATE berth_schema_migrations SET version = $1", int64(v)); err != nil {
			tb.Fatalf("set the schema version: %v", err)
		}
	},
	Ports: store.Range(testports.Pgstore),
}

// conformanceConn connects to dsn, closed when tb ends.
func conformanceConn(tb testing.TB, dsn string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The test binary serves as the suite's worker processes too.
func init() { storetest.MaybeRunWorker(conformance) }

// TestConformance runs the suite every berth store passes, each case in a
// schema of its own.
func TestConformance(t *testing.T) {
	testports.Hold(t, testports.Pgstore) // ProcessesRace binds there
	storetest.Run(t, conformance)
}
