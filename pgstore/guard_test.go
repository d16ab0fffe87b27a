package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// ownDatabase makes a database of the test's own, dropped when it ends,
// and returns a DSN for it: the tests below need btree_gist to be where
// they put it, and the shared database has it already. It skips the test
// without a key=value DSN or the right to create databases.
func ownDatabase(tb testing.TB) string {
	tb.Helper()
	base := os.Getenv(envDSN)
	if base == "" || strings.Contains(base, "://") {
		tb.Skipf("set %s to a key=value PostgreSQL DSN to run this test", envDSN)
	}
	db, drop, err := pgschema.CreateDatabase(context.Background(), base, "berth_guard")
	if errors.Is(err, pgschema.ErrNoCreateDB) {
		tb.Skipf("a database of the test's own: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("drop the test's database: %v", err)
		}
	})
	return db
}

func hasGuard(tb testing.TB, conn *pgx.Conn) bool {
	tb.Helper()
	var ok bool
	err := conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_constraint"+
		" WHERE conrelid = 'berth_port_allocations'::regclass AND conname = 'berth_port_allocations_no_conflict')").Scan(&ok)
	if err != nil {
		tb.Fatal(err)
	}
	return ok
}

// extensionElsewhere makes a database of the test's own with btree_gist
// in schema "other" and an empty schema "berth", and returns a connection
// to the database (closed when the test ends) and a DSN for schema berth.
func extensionElsewhere(tb testing.TB) (admin *pgx.Conn, dsn string) {
	tb.Helper()
	db := ownDatabase(tb)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, db)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = admin.Close(ctx) })
	for _, q := range []string{
		"CREATE SCHEMA other", "CREATE EXTENSION btree_gist SCHEMA other", "CREATE SCHEMA berth",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	return admin, pgschema.WithParam(db, "search_path", "berth")
}

// TestGuardRestored: dropping the schema that holds btree_gist drops the
// exclusion constraint of berth's table in another schema, silently. The
// next store to claim the host's lease (an Open, or a store's renewal)
// puts it back, and conflicts are refused again. When rows granted in the
// meantime conflict, it cannot: every store then refuses to grant, and
// Open fails, with an error wrapping store.ErrDamaged, until the conflict
// is released.
func TestGuardRestored(t *testing.T) {
	ctx := context.Background()
	admin, dsn := extensionElsewhere(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()

	s1 := openWith(t, dsn, pgstore.Options{Host: "h1"})
	held := key(store.TCP, "127.0.0.1", 30001)
	if _, err := s1.Reserve(ctx, store.Request{Key: held}); err != nil {
		t.Fatal(err)
	}
	if !hasGuard(t, conn) {
		t.Fatal("a new store has no exclusion constraint")
	}
	if _, err := admin.Exec(ctx, "DROP SCHEMA other CASCADE"); err != nil {
		t.Fatal(err)
	}
	if hasGuard(t, conn) {
		t.Fatal("the constraint survived its extension: the test proves nothing")
	}

	// Open puts it back, and the held port is refused again.
	s2 := openWith(t, dsn, pgstore.Options{Host: "h1"})
	if !hasGuard(t, conn) {
		t.Fatal("Open left the exclusion constraint missing")
	}
	var ce *store.ConflictError
	if _, err := s2.Reserve(ctx, store.Request{Key: key(store.TCP, "0.0.0.0", 30001)}); !errors.As(err, &ce) {
		t.Fatalf("Reserve of a held port after the restore = %v, want a conflict", err)
	}

	// Gone again, and a row granted meanwhile conflicts: nothing can put
	// it back, and no store grants.
	if _, err := admin.Exec(ctx, "DROP EXTENSION btree_gist CASCADE"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO berth_port_allocations"+
		" (host_no, protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind)"+
		" SELECT host_no, protocol, port, address, owner_pid, owner_start + 1, owner_scope, 'twin', label, kind"+
		" FROM berth_port_allocations WHERE port = 30001"); err != nil {
		t.Fatal(err)
	}
	err = s1.RenewLease(ctx, time.Minute)
	if !errors.Is(err, store.ErrDamaged) || errors.Is(err, store.ErrStorage) || !strings.Contains(err.Error(), "30001") ||
		!strings.Contains(err.Error(), "lost its exclusion constraint berth_port_allocations_no_conflict") ||
		!strings.Contains(err.Error(), "grants no port") {
		t.Fatalf("Renew with conflicting rows = %v, want an error wrapping ErrDamaged that says the constraint is lost, naming port 30001", err)
	}
	for name, grant := range map[string]func() error{
		"Reserve": func() error {
			_, err := s1.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 30002)})
			return err
		},
		"Scan": func() error {
			ports := []uint16{30003}
			_, err := s1.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Next: func() (uint16, bool) {
				if len(ports) == 0 {
					return 0, false
				}
				p := ports[0]
				ports = ports[1:]
				return p, true
			}})
			return err
		},
		"ReserveFleet": func() error {
			_, err := s1.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Holder: "job/x",
				Band: store.Range{First: 30004, Last: 30005}, TTL: time.Minute})
			return err
		},
	} {
		if err := grant(); !errors.Is(err, store.ErrDamaged) {
			t.Errorf("%s while the constraint is missing = %v, want an error wrapping ErrDamaged", name, err)
		}
	}
	if _, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: "h2", SweepInterval: -1, LeaseTTL: -1}); !errors.Is(err, store.ErrDamaged) {
		t.Fatalf("Open with conflicting rows = %v, want an error wrapping ErrDamaged", err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations WHERE port BETWEEN 30002 AND 30005").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows granted while refusing: %d (%v)", n, err)
	}

	// The twin released, the next renewal restores it and grants resume.
	if _, err := conn.Exec(ctx, "DELETE FROM berth_port_allocations WHERE owner_name = 'twin'"); err != nil {
		t.Fatal(err)
	}
	if err := s1.RenewLease(ctx, time.Minute); err != nil {
		t.Fatalf("Renew once the conflict is gone: %v", err)
	}
	if !hasGuard(t, conn) {
		t.Fatal("the renewal left the constraint missing")
	}
	if _, err := s1.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 30002)}); err != nil {
		t.Fatalf("Reserve after the restore: %v", err)
	}
}

// TestGuardRestoredConcurrently: when the constraint is gone, stores that
// all notice at once (six Opens here) each end with it back, none with an
// error: one restores it and the others find it restored.
func TestGuardRestoredConcurrently(t *testing.T) {
	ctx := context.Background()
	admin, dsn := extensionElsewhere(t)
	openWith(t, dsn, pgstore.Options{Host: "h0"})
	if _, err := admin.Exec(ctx, "DROP SCHEMA other CASCADE"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if hasGuard(t, conn) {
		t.Fatal("the constraint survived its extension: the test proves nothing")
	}

	const opens = 6
	start := make(chan struct{})
	errs := make(chan error, opens)
	for i := range opens {
		go func() {
			<-start
			s, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: fmt.Sprintf("h%d", i+1), SweepInterval: -1, LeaseTTL: -1})
			if err == nil {
				err = s.Close()
			}
			errs <- err
		}()
	}
	close(start)
	for range opens {
		if err := <-errs; err != nil {
			t.Errorf("Open while others restore the constraint: %v", err)
		}
	}
	if !hasGuard(t, conn) {
		t.Fatal("the Opens left the exclusion constraint missing")
	}
}
