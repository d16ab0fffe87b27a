package statestore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/store"
)

// BenchmarkReserveRelease is one reserve and one release of the same key on
// a file database, without a bind probe.
func BenchmarkReserveRelease(b *testing.B) {
	s, _ := open(b)
	benchRoundTrip(b, s)
}

// BenchmarkReserveRelease10k is the same with 10,000 rows of live owners
// already in the table: the cost must stay flat.
func BenchmarkReserveRelease10k(b *testing.B) {
	s, path := open(b)
	me, _ := store.Self()
	fill(b, path, 10000, func(int) store.Owner { return me })
	benchRoundTrip(b, s)
}

func benchRoundTrip(b *testing.B, s store.Store) {
	b.Helper()
	ctx := context.Background()
	key := tcp(lo4, 40000) // above the rows fill writes
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, key, store.Owner{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReap10k reaps 10,000 rows of 1,000 exited owners (ten rows each).
func BenchmarkReap10k(b *testing.B) {
	ctx := context.Background()
	s, path := open(b)
	for b.Loop() {
		b.StopTimer()
		fill(b, path, 10000, func(i int) store.Owner { return deadOwner(b, time.Duration(i/10)*time.Second) })
		b.StartTimer()
		n, err := s.Reap(ctx)
		if err != nil || n != 10000 {
			b.Fatalf("Reap = %d, %v; want 10000", n, err)
		}
	}
}

// fill inserts n rows on tcp 127.0.0.1 ports 20000.. straight into the
// table, owned by owner(i).
func fill(b *testing.B, path string, n int, owner func(i int) store.Owner) {
	b.Helper()
	fillRows(b, path, n, func(i int) (store.Key, store.Owner) {
		return store.Key{Protocol: store.TCP, Addr: lo4, Port: uint16(20000 + i)}, owner(i)
	})
}

// fillRows inserts n rows straight into the table in one transaction, the
// i-th with the key and owner row(i) gives.
func fillRows(b *testing.B, path string, n int, row func(i int) (store.Key, store.Owner)) {
	b.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	stmt, err := tx.Prepare(`INSERT INTO port_allocations (protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind, created_at)
		VALUES (?, ?, ?, ?, ?, ?, 'bench', '', 'dynamic', 0)`)
	if err != nil {
		b.Fatal(err)
	}
	defer stmt.Close()
	for i := range n {
		k, o := row(i)
		addr, _ := netaddr.Pack(k.Addr)
		if _, err := stmt.Exec(string(k.Protocol), int(k.Port), addr, o.PID, o.Start, o.Namespace); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}
