package statestore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/store"
)

// TestMakeFreshNeverReplacesAStore: a process that makes a new store where
// a lost one was never replaces a store another process put in place
// meanwhile (two may make one at once when the directory is removed again
// under the first one's locks, and the second's file may already have
// granted ports): it drops its own file and leaves that one. An empty file
// in the place, which SQLite makes when a process opens a path with no
// file, is nobody's store, and is replaced. A new file removed while it is
// made (its directory removed) is reported with ErrLost, on which Open
// starts again.
func TestMakeFreshNeverReplacesAStore(t *testing.T) {
	ctx := context.Background()
	k, err := known()
	if err != nil {
		t.Fatal(err)
	}
	makeAt := func(path string) error {
		return makeFresh(ctx, path, fileState{fresh: true}, k, time.Second, logr.Discard())
	}
	key := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 24151}

	t.Run("a store made meanwhile", func(t *testing.T) {
		// The store "another process" made: one reservation in it, all
		// of it in its file.
		path := filepath.Join(t.TempDir(), "berth.db")
		s, err := Open(ctx, path, Options{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := checkpointAll(ctx, path, time.Second); err != nil {
			t.Fatal(err)
		}
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := makeAt(path); err != nil {
			t.Fatalf("makeFresh beside a store made meanwhile = %v; want nil", err)
		}
		if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
			t.Fatalf("the store made meanwhile changed (%d bytes before, %d after, %v); want it left as it was", len(before), len(after), err)
		}
		noneMade(t, path)
		s, err = Open(ctx, path, Options{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if rows, err := s.List(ctx, store.Filter{}); err != nil || len(rows) != 1 || rows[0].Key != key {
			t.Errorf("the store at the path holds %v, %v; want the one made meanwhile, with its reservation of %s", rows, err, key)
		}
	})

	t.Run("an empty file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := makeAt(path); err != nil {
			t.Fatalf("makeFresh over an empty file = %v; want nil", err)
		}
		noneMade(t, path)
		db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v uint
		if err := db.QueryRow("SELECT version FROM schema_migrations").Scan(&v); err != nil || v != SchemaVersion {
			t.Errorf("schema version of the file made in the empty one's place = %d, %v; want %d", v, err, SchemaVersion)
		}
	})

	t.Run("its directory removed", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "gone", "berth.db")
		if err := makeAt(path); !errors.Is(err, store.ErrLost) {
			t.Errorf("makeFresh in a removed directory = %v; want ErrLost", err)
		}
	})
}

// noneMade fails t when a file makeFresh builds in is left beside path.
func noneMade(t *testing.T, path string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range entries {
		if strings.Contains(e.Name(), freshSuffix) {
			t.Errorf("%s left in the state directory", e.Name())
		}
	}
}
