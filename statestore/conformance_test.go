package statestore_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/golang-migrate/migrate/v4/database/sqlite"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// conformance reaches a database file through its path. The schema version
// is golang-migrate's schema_migrations table in the file, as statestore
// keeps it.
var conformance = storetest.Config{
	Open: func(t *testing.T) (store.Store, string) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "berth.db")
		s, err := statestore.Open(context.Background(), path, statestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s, path
	},
	Reopen: func(ctx context.Context, path string) (store.Store, error) {
		return statestore.Open(ctx, path, statestore.Options{})
	},
	SchemaVersion: func(tb testing.TB, path string) uint {
		tb.Helper()
		var v uint
		if err := migrationsDB(tb, path).QueryRow("SELECT version FROM " + sqlite.DefaultMigrationsTable).Scan(&v); err != nil {
			tb.Fatalf("read the schema version of %s: %v", path, err)
		}
		return v
	},
	// A schema the store must refuse is, for this store, one of a newer
	// write version too (a newer schema of a write version it knows is
	// used: TestNewerSchema).
	SetSchemaVersion: func(tb testing.TB, path string, v uint) {
		tb.Helper()
		w := statestore.WriteVersion
		if v > statestore.SchemaVersion {
			w++
		}
		if _, err := migrationsDB(tb, path).Exec("UPDATE "+sqlite.DefaultMigrationsTable+" SET version = ?", v); err != nil {
			tb.Fatalf("set the schema version of %s: %v", path, err)
		}
		if _, err := migrationsDB(tb, path).Exec(fmt.Sprintf("PRAGMA user_version = %d", w)); err != nil {
			tb.Fatalf("set the write version of %s: %v", path, err)
		}
	},
	Ports: store.Range(testports.Statestore),
}

// migrationsDB opens the database file at path with SQLite itself (never
// anything else: see DESIGN.md), closed when tb ends. It waits for a
// write transaction of the store that has the file open.
func migrationsDB(tb testing.TB, path string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// The test binary serves as the suite's worker processes too.
func init() { storetest.MaybeRunWorker(conformance) }

// TestConformance runs the suite every berth store passes.
func TestConformance(t *testing.T) {
	testports.Hold(t, testports.Statestore) // ProcessesRace binds there
	storetest.Run(t, conformance)
}
