package statestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestCloseOfEmptiedStore: a store truncated to nothing (by a cleaner)
// while a process holds it open must still open, whole, once that process
// closes it. Closing the last connection checkpoints the WAL into the
// file: into an emptied file that writes a few pages with no schema
// around them, which every later opener took for a damaged store. With a
// long WAL (no read-only guard kept the WAL open) and a short one.
func TestCloseOfEmptiedStore(t *testing.T) {
	ctx := context.Background()
	for _, commits := range []int{4, 400} {
		path := filepath.Join(t.TempDir(), "state", "berth.db")
		s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		for i := range commits {
			key := store.Key{Protocol: store.TCP, Addr: loopback, Port: uint16(26300 + i%60)}
			r, err := s.Reserve(ctx, store.Request{Key: key})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, r.Key, r.Owner); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		_ = s.Close() // lost: it may say so
		again, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatalf("%d commits: Open after the holder of an emptied store closed it: %v; want a new store", commits, err)
		}
		key := store.Key{Protocol: store.UDP, Addr: loopback, Port: 26363}
		if _, err := again.Reserve(ctx, store.Request{Key: key}); err != nil {
			t.Errorf("%d commits: Reserve in the store opened again: %v", commits, err)
		}
		if err := again.Close(); err != nil {
			t.Error(err)
		}
	}
}

// TestOpenOfPageWithNoTable: a file emptied under a connection that then
// set WAL mode on it is left one page long with no table. Open must take
// it for nobody's store and make the store anew, not serve from it.
func TestOpenOfPageWithNoTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("PRAGMA journal_mode=WAL"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("the file SQLite left: %v, %v; want a page", fi, err)
	}
	openAnew(t, path, "a file with a page and no table", store.Key{Protocol: store.TCP, Addr: loopback, Port: 26362})
}

// TestOpenWhenWALRemovedUnderHolders: SQLite removes a store's WAL by name
// when a connection opened on an emptied file at the same path reads, and
// the holders of the store made since keep writing to the WAL they have
// open, so its index (-shm) promises frames that the WAL at the path lacks.
// Every opener then met a short read until the holders closed. Open must
// set that store aside and make it anew; the holder finds it lost.
func TestOpenWhenWALRemovedUnderHolders(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	holder, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	for i := range 20 {
		key := store.Key{Protocol: store.TCP, Addr: loopback, Port: uint16(26300 + i)}
		if _, err := holder.Reserve(ctx, store.Request{Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(path + "-wal"); err != nil {
		t.Fatal(err)
	}
	openAnew(t, path, "a store whose WAL was removed under its holder", store.Key{Protocol: store.UDP, Addr: loopback, Port: 26361})
	if err := holder.Check(ctx); !errors.Is(err, store.ErrLost) {
		t.Errorf("the holder's Check = %v; want store.ErrLost, so that it puts its rows back", err)
	}
}

// openAnew opens the store at path, which holds what, and reserves key in
// it: Open must have made the store anew, and the store must serve.
func openAnew(t *testing.T, path, what string, key store.Key) {
	t.Helper()
	s, err := statestore.Open(context.Background(), path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatalf("Open of %s: %v; want the store made anew", what, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Reserve(context.Background(), store.Request{Key: key}); err != nil {
		t.Errorf("Reserve in the store opened over %s: %v", what, err)
	}
}

// TestHolderFindsWALRemoved: a holder whose WAL was removed by name (by
// SQLite itself, reading an emptied file at the path; by a cleaner) would
// go on writing to a file no other process reads; a store opened since
// then reads frames that the index names and its WAL lacks (SQLite's short
// read). Both must find the store lost, so that an open makes it anew.
func TestHolderFindsWALRemoved(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	holder, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	key := store.Key{Protocol: store.TCP, Addr: loopback, Port: 26340}
	if _, err := holder.Reserve(ctx, store.Request{Key: key}); err != nil {
		t.Fatal(err)
	}
	// With every frame checkpointed, an opener needs none from the WAL.
	// other stands for a writer that raced the removal, or an older berth.
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetMaxOpenConns(1)
	var version int
	if err := other.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path + "-wal"); err != nil {
		t.Fatal(err)
	}
	if err := holder.Check(ctx); !errors.Is(err, store.ErrLost) {
		t.Errorf("Check after the WAL was removed = %v; want store.ErrLost", err)
	}
	later, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	key.Port++
	if _, err := holder.Reserve(ctx, store.Request{Key: key}); !errors.Is(err, store.ErrLost) {
		t.Errorf("Reserve after the WAL was removed = %v; want store.ErrLost", err)
	}
	key.Port++
	if _, err := later.Reserve(ctx, store.Request{Key: key}); err != nil {
		t.Errorf("Reserve by a store opened since = %v; want a reservation", err)
	}
	if _, err := other.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", version)); err != nil {
		t.Fatal(err)
	}
	key.Port++
	if _, err := later.Reserve(ctx, store.Request{Key: key}); !errors.Is(err, store.ErrLost) {
		t.Errorf("Reserve by a store opened since, once the removed WAL was written = %v; want store.ErrLost", err)
	}
	openAnew(t, path, "a store whose index names frames of a removed WAL", store.Key{Protocol: store.UDP, Addr: loopback, Port: 26343})
}
