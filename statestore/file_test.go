package statestore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestDamagedFileRefused: Open refuses files it must not write to, says what
// is wrong, and leaves every byte as it was.
func TestDamagedFileRefused(t *testing.T) {
	ctx := context.Background()

	// A real store with rows, to damage below.
	good := filepath.Join(t.TempDir(), "good.db")
	s := openAt(t, good)
	for i := range 200 {
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, uint16(20000+i)), Label: strings.Repeat("x", 100)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(goodBytes) < 4*4096 {
		t.Fatalf("test database is only %d bytes; want several pages", len(goodBytes))
	}

	random := make([]byte, 8192)
	for i := range random {
		random[i] = byte(rand.IntN(256))
	}
	foreign := filepath.Join(t.TempDir(), "foreign.db")
	makeForeignDB(t, foreign)
	foreignBytes, _ := os.ReadFile(foreign)

	tests := []struct {
		name    string
		content []byte // nil: a directory in the file's place
		want    string
	}{
		{"random bytes", random, "not a SQLite database"},
		{"text", []byte("port=20000\n"), "not a SQLite database"},
		{"truncated to a page boundary", goodBytes[:len(goodBytes)/4096/2*4096], "truncated"},
		{"truncated mid-page", goodBytes[:len(goodBytes)/2+123], "truncated"},
		{"truncated inside the header", goodBytes[:50], "truncated"},
		{"another program's database", foreignBytes, "another program"},
		{"directory", nil, "is a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "berth.db")
			if tt.content == nil {
				if err := os.Mkdir(path, 0o700); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(path, tt.content, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
			if err == nil {
				_ = s.Close()
				t.Fatalf("Open(%s) succeeded; want an error", tt.name)
			}
			if !errors.Is(err, store.ErrDamaged) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Open error = %q; want ErrDamaged naming the path and saying %q", err, tt.want)
			}
			if tt.content != nil {
				after, err := os.ReadFile(path)
				if err != nil || !bytes.Equal(after, tt.content) {
					t.Errorf("file changed by a refused Open (%d bytes before, %d after, %v)", len(tt.content), len(after), err)
				}
			}
			if _, err := os.Stat(path + "-wal"); err == nil {
				t.Errorf("refused Open left a -wal file beside %s", path)
			}
		})
	}
}

func makeForeignDB(tb testing.TB, path string) {
	tb.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL); INSERT INTO invoices VALUES (1, 9.5)"); err != nil {
		tb.Fatal(err)
	}
}

// TestNewerSchemaRefused: a database written by a newer berth is refused
// with a message that says so, and is not modified.
func TestNewerSchemaRefused(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s := openAt(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	// A schema that older writers must not write to: a newer write version.
	if _, err := db.Exec(fmt.Sprintf("UPDATE schema_migrations SET version = 99; PRAGMA user_version = %d", statestore.WriteVersion+1)); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	before, _ := os.ReadFile(path)
	_, err = statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	want := fmt.Sprintf("schema version 99 of write version %d", statestore.WriteVersion+1)
	if !errors.Is(err, store.ErrSchemaTooNew) || !strings.Contains(err.Error(), want) {
		t.Errorf("Open(newer schema) = %v; want ErrSchemaTooNew naming %q", err, want)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Error("Open of a newer schema changed the file")
	}
}

// TestOpenRestoresWAL: a store someone switched out of WAL mode (the
// sqlite3 shell can) is switched back when it is opened.
func TestOpenRestoresWAL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mode := func(set string) string {
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var m string
		if err := db.QueryRow("PRAGMA journal_mode" + set).Scan(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := mode(" = DELETE"); m != "delete" {
		t.Fatalf("journal mode set to %q; want delete", m)
	}
	s = openAt(t, path)
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 40000)}); err != nil {
		t.Fatal(err)
	}
	if m := mode(""); m != "wal" {
		t.Errorf("journal mode after Open = %q; want wal", m)
	}
}

// TestCloseLeavesShortWAL: a store that wrote little leaves its WAL for the
// next process (no checkpoint, so no fsync, on Close); one whose WAL has
// grown past a size checkpoints it into the database file and empties it.
// Either way every row is there for the next Open, and for a plain SQLite
// connection that opens the file after the store has closed.
func TestCloseLeavesShortWAL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	walSize := func() int64 {
		t.Helper()
		fi, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}

	s := openAt(t, path)
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 20000), Label: "short"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if walSize() == 0 {
		t.Fatal("a store that made one reservation emptied its WAL on Close; want it left for the next process")
	}
	if got := countRows(t, path); got != 1 {
		t.Fatalf("rows after the first Close = %d; want 1", got)
	}

	s = openAt(t, path)
	for i := range 400 {
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, uint16(20001+i)), Label: strings.Repeat("y", 200)}); err != nil {
			t.Fatal(err)
		}
	}
	if walSize() == 0 {
		t.Fatal("WAL is empty before Close")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := walSize(); n != 0 {
		t.Errorf("WAL after a Close with 400 commits in it = %d bytes; want it checkpointed and emptied", n)
	}
	if got := countRows(t, path); got != 401 {
		t.Errorf("rows after the second Close = %d; want 401", got)
	}
}

// countRows counts the reservations in the store at path through a plain
// SQLite connection of its own, opened after the store has closed.
func countRows(tb testing.TB, path string) int {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM port_allocations").Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}
