package statestore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// TestViewFollowsOtherWriters checks that a store's view of held ports
// never outlives the rows it was read from: a port that another
// connection releases, or that this store releases itself, is granted by
// the very next scan, with no other candidate to fall back to.
func TestViewFollowsOtherWriters(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	a, b := openAt(t, path), openAt(t, path)
	w := startWorker(t, "hold", filepath.Join(t.TempDir(), "unused.db"), "BERTH_TEST_PORTS=[]")
	w.until(t, "done")
	child, err := store.LookupOwner(ctx, w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	scan := func(ps ...uint16) (store.Reservation, error) {
		return a.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: storetest.Candidates(ps...)})
	}
	hold := func(port uint16) {
		t.Helper()
		if _, err := b.Reserve(ctx, store.Request{Key: tcp(lo4, port), Owner: child}); err != nil {
			t.Fatal(err)
		}
		// a's scan passes over it and so learns that child holds it.
		r, err := scan(port, port+1)
		if err != nil || r.Port != port+1 {
			t.Fatalf("Scan(%d, %d) = %v, %v; want %d", port, port+1, r.Port, err, port+1)
		}
		if err := a.Release(ctx, r.Key, store.Owner{}); err != nil {
			t.Fatal(err)
		}
	}

	// Released through another connection.
	hold(25100)
	if err := b.Release(ctx, tcp(lo4, 25100), child); err != nil {
		t.Fatal(err)
	}
	if r, err := scan(25100); err != nil || r.Port != 25100 {
		t.Errorf("Scan(25100) after another store released it = %v, %v; want 25100", r.Port, err)
	}

	// Released through this store itself, a write that moves no
	// data_version: the view must drop the row as it goes (the holder
	// still runs, so a stale row would keep the port held).
	hold(25110)
	if err := a.Release(ctx, tcp(lo4, 25110), child); err != nil {
		t.Fatal(err)
	}
	if r, err := scan(25110); err != nil || r.Port != 25110 {
		t.Errorf("Scan(25110) after this store released it = %v, %v; want 25110", r.Port, err)
	}

	// Taken through another connection after the view saw it free: the
	// scan must not grant it.
	if _, err := scan(25120); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, tcp(lo4, 25120), store.Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, store.Request{Key: tcp(lo4, 25120), Owner: child}); err != nil {
		t.Fatal(err)
	}
	if r, err := scan(25120, 25121); err != nil || r.Port != 25121 {
		t.Errorf("Scan(25120, 25121) with 25120 held elsewhere = %v, %v; want 25121", r.Port, err)
	}
}

// TestUpgradeDropsJournal: a store of schema version 4, with its change
// journal, comes to the current version when opened: the journal and its
// triggers are gone, and the reservations stay.
func TestUpgradeDropsJournal(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 25200), Label: "kept"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var downs []string
	for _, f := range []string{"migrations/6_lease_until.down.sql", "migrations/5_drop_port_changes.down.sql"} {
		down, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		downs = append(downs, string(down))
	}
	db := migrationsDB(t, path)
	for _, q := range []string{downs[0], downs[1], "PRAGMA user_version = 0", "UPDATE schema_migrations SET version = 4, dirty = 0",
		"INSERT INTO port_changes (protocol, port) VALUES ('tcp', 25200)"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("make a version-4 store: %v", err)
		}
	}

	s = openAt(t, path)
	if rs := list(t, s); len(rs) != 1 || rs[0].Port != 25200 || rs[0].Label != "kept" {
		t.Errorf("rows after the upgrade = %+v; want 25200 labelled kept", rs)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_schema WHERE name = 'port_changes' OR type = 'trigger'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d journal objects after the upgrade; want none", n)
	}
	if v := conformance.SchemaVersion(t, path); v != statestore.SchemaVersion {
		t.Errorf("schema version after the upgrade = %d; want %d", v, statestore.SchemaVersion)
	}
}
