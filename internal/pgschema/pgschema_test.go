package pgschema_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/pgschema"
)

// TestExtensionOutlivesSchema: on a database without btree_gist, Create
// puts the extension outside the schema it makes, so dropping that schema
// leaves the extension, and other schemas' exclusion constraints, alone.
func TestExtensionOutlivesSchema(t *testing.T) {
	base := os.Getenv("BERTH_TEST_POSTGRES")
	if base == "" || strings.Contains(base, "://") {
		t.Skip("set BERTH_TEST_POSTGRES to a key=value PostgreSQL DSN (bash .ci/postgres start prints one)")
	}
	ctx := context.Background()
	db, dropDB, err := pgschema.CreateDatabase(ctx, base, "berth_pgschema")
	if errors.Is(err, pgschema.ErrNoCreateDB) {
		t.Skipf("a database of the test's own: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := dropDB(); err != nil {
			t.Errorf("drop the test's database: %v", err)
		}
	}()

	scoped, drop, err := pgschema.Create(ctx, db, "berth_x")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, scoped)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var schema, extSchema string
	if err := conn.QueryRow(ctx, "SELECT current_schema(), (SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'btree_gist')").Scan(&schema, &extSchema); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(schema, "berth_x_") {
		t.Fatalf("the scoped DSN works in schema %q, want berth_x_N", schema)
	}
	if extSchema == schema || extSchema == "" {
		t.Fatalf("btree_gist is in schema %q, the throwaway one's %q", extSchema, schema)
	}
	if err := drop(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("schema %s left after drop: %d (%v)", schema, n, err)
	}
}
