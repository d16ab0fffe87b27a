package portalloc_test

import (
	"context"
	"database/sql"
	"net"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portlock"
)

// BenchmarkGrant compares one Allocate+Release through the state store
// with the floor the guarantee itself needs, in the same run: a port's
// kernel lock taken and let go, a bind probe, and two bare SQLite write
// transactions (the row's insert and its delete) on a file with the
// store's settings; and with a bare net.Listen("tcp", "127.0.0.1:0") and
// Close, what users compare berth with.
func BenchmarkGrant(b *testing.B) {
	ctx := context.Background()
	b.Run("statestore", func(b *testing.B) {
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: b.TempDir(), Range: allocRange, IgnoreEnv: true})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = a.Close() }()
		for b.Loop() {
			r, err := a.Allocate(ctx, portalloc.Request{})
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Release(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("floor", func(b *testing.B) {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(b.TempDir(), "floor.db")+
			"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = db.Close() }()
		db.SetMaxOpenConns(1)
		if _, err := db.Exec("CREATE TABLE t (protocol TEXT, port INTEGER, address BLOB, PRIMARY KEY (protocol, port, address)) WITHOUT ROWID"); err != nil {
			b.Fatal(err)
		}
		tx := func(q string, args ...any) {
			t, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := t.Exec(q, args...); err != nil {
				b.Fatal(err)
			}
			if err := t.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		port := allocRange.First
		addr := lo4.AsSlice()
		for b.Loop() {
			lk, err := portlock.Acquire("tcp", lo4, port)
			if err != nil {
				b.Fatal(err)
			}
			if free, err := portlock.Probe("tcp", lo4, port); err != nil || !free {
				b.Fatalf("probe of %d: %v, %v", port, free, err)
			}
			tx("INSERT INTO t VALUES ('tcp', ?, ?)", port, addr)
			tx("DELETE FROM t WHERE protocol = 'tcp' AND port = ? AND address = ?", port, addr)
			_ = lk.Close()
		}
	})
	b.Run("listen", func(b *testing.B) {
		for b.Loop() {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			_ = l.Close()
		}
	})
}
