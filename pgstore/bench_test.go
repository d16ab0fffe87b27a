package pgstore_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// BenchmarkReserveRelease: a free port granted and given back, one round
// trip each.
func BenchmarkReserveRelease(b *testing.B) {
	dsn, _ := testDB(b)
	s := open(b, dsn, "h1")
	ctx := context.Background()
	k := key(store.TCP, "127.0.0.1", 58000)
	for b.Loop() {
		if _, err := s.Reserve(ctx, store.Request{Key: k}); err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, k, store.Owner{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScanHalfHeld: a scan whose first 32 candidates are held by
// another live owner: one round trip for the held batch, one that grants.
func BenchmarkScanHalfHeld(b *testing.B) {
	dsn, _ := testDB(b)
	s := open(b, dsn, "h1")
	ctx := context.Background()
	other, _ := child(b)
	var ports []uint16
	for p := uint16(58100); p < 58164; p++ {
		ports = append(ports, p)
		if p < 58132 {
			if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", p), Owner: other}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for b.Loop() {
		r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Next: storetest.Candidates(ports...)})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, r.Key, store.Owner{}); err != nil {
			b.Fatal(err)
		}
	}
}
