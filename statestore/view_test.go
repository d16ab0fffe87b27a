package statestore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store/storetest"
)

// TestViewFollowsOtherWriters checks that a store's view of held ports
// never outlives the rows it was read from: a port that another
// connection releases, or that this store frees by a bulk delete, is
// granted by the very next scan, with no other candidate to fall back to.
func TestViewFollowsOtherWriters(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	a, b := openAt(t, path), openAt(t, path)
	w := startWorker(t, "hold", filepath.Join(t.TempDir(), "unused.db"), "BERTH_TEST_PORTS=[]")
	w.until(t, "done")
	child, err := statestore.LookupOwner(ctx, w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	scan := func(ps ...uint16) (statestore.Reservation, error) {
		return a.Scan(ctx, statestore.ScanRequest{Protocol: statestore.TCP, Addr: lo4, Next: storetest.Candidates(ps...)})
	}
	hold := func(port uint16) {
		t.Helper()
		if _, err := b.Reserve(ctx, statestore.Request{Key: tcp(lo4, port), Owner: child}); err != nil {
			t.Fatal(err)
		}
		// a's scan passes over it and so learns that child holds it.
		r, err := scan(port, port+1)
		if err != nil || r.Port != port+1 {
			t.Fatalf("Scan(%d, %d) = %v, %v; want %d", port, port+1, r.Port, err, port+1)
		}
		if err := a.Release(ctx, r.Key, statestore.Owner{}); err != nil {
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

	// Freed by this store's own bulk delete, which moves no data_version.
	hold(25110)
	if n, err := a.ReleaseOwner(ctx, child); err != nil || n != 1 {
		t.Fatalf("ReleaseOwner(child) = %d, %v; want 1", n, err)
	}
	if r, err := scan(25110); err != nil || r.Port != 25110 {
		t.Errorf("Scan(25110) after ReleaseOwner = %v, %v; want 25110", r.Port, err)
	}

	// Taken through another connection after the view saw it free: the
	// scan must not grant it.
	if _, err := scan(25120); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, tcp(lo4, 25120), statestore.Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, statestore.Request{Key: tcp(lo4, 25120), Owner: child}); err != nil {
		t.Fatal(err)
	}
	if r, err := scan(25120, 25121); err != nil || r.Port != 25121 {
		t.Errorf("Scan(25120, 25121) with 25120 held elsewhere = %v, %v; want 25121", r.Port, err)
	}
}
