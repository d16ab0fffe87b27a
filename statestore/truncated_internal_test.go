package statestore

import (
	"context"
	"database/sql"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/store"
)

// A file truncated under the store and written back by a checkpoint whose
// pages fill every file system block they touch, so that no hole shows:
// its second page, which a checkpoint almost never writes, is zeros, and
// the store reports the file lost.
func TestTruncatedSecondPageIsLost(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := Open(ctx, path, Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.page2 == 0 {
		t.Fatal("the store did not find a b-tree page second in its file")
	}
	reserve := func(first, n int) {
		t.Helper()
		for p := first; p < first+n; p++ {
			key := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: uint16(p)}
			if _, err := s.Reserve(ctx, Request{Key: key}); err != nil {
				t.Fatal(err)
			}
		}
	}
	reserve(24200, 200)
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	reserve(24400, 200)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
		t.Fatal(err)
	}
	s.holes = false // as on a file system that shows no holes
	if err := s.Check(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("Check of a file truncated and written back, its holes not looked for = %v; want ErrLost", err)
	}
}
