package statestore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func init() {
	// churn reserves and releases one port after another until stdin
	// closes: the other writer of a busy store.
	extraWorkers["churn"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return err
		}
		defer s.Close()
		stop := make(chan struct{})
		go func() { _, _ = os.Stdin.Read(make([]byte, 1)); close(stop) }()
		_ = out.Encode(event{Event: "ready"})
		addr := netip.MustParseAddr("127.0.0.9")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return nil
			default:
			}
			key := store.Key{Protocol: store.TCP, Addr: addr, Port: uint16(50000 + i%1000)}
			if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
				return err
			}
			if err := s.Release(ctx, key, store.Owner{}); err != nil {
				return err
			}
		}
	}
}

// BenchmarkBusyStore is one Scan and Release of a port of a 2,000-port
// range while another process commits one reservation after another, with
// 0 to 100,000 rows of an idle live process in the table (UDP rows, out of
// the scan's way: what they cost is only keeping the in-memory view exact).
// The cost must not grow with the rows.
func BenchmarkBusyStore(b *testing.B) {
	for _, rows := range []int{0, 1000, 10000, 100000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			busyScan(b, func(path string, idle store.Owner) { fillUDP(b, path, rows, idle) })
		})
	}
}

// BenchmarkBusyStoreFull is BenchmarkBusyStore with 90% of the scanned
// ports held by the idle process, in the scan's way: the worst case of a
// view that another writer keeps making stale, where every held candidate
// a scan visits is read again by its key.
func BenchmarkBusyStoreFull(b *testing.B) {
	busyScan(b, func(path string, idle store.Owner) {
		// Every port of 20000-21999 but each tenth, on the scan's address.
		fillRows(b, path, 1800, func(i int) (store.Key, store.Owner) { return tcp(lo4, uint16(20000+i/9*10+i%9+1)), idle })
	})
}

// busyScan times Scan+Release of a tcp port of 20000-21999 on a store
// that fill has filled with rows of an idle live process, while a churn
// worker commits one reservation after another.
func busyScan(b *testing.B, fill func(path string, idle store.Owner)) {
	b.Helper()
	ctx := context.Background()
	s, path := open(b)
	idle := exec.Command("sleep", "3600")
	if err := idle.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = idle.Process.Kill(); _ = idle.Wait() })
	o, err := store.LookupOwner(ctx, idle.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	fill(path, o)
	w := startWorker(b, "churn", path)
	w.until(b, "ready")
	port := 0
	next := func() (uint16, bool) { port = (port + 1 + rand.IntN(7)) % 2000; return uint16(20000 + port), true }
	b.ResetTimer()
	for b.Loop() {
		r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: next})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, r.Key, store.Owner{}); err != nil {
			b.Fatal(err)
		}
	}
}

// fillUDP inserts n rows on udp ports of 127.0.0.2 and 127.0.0.3 owned by o.
func fillUDP(b *testing.B, path string, n int, o store.Owner) {
	b.Helper()
	fillRows(b, path, n, func(i int) (store.Key, store.Owner) {
		return store.Key{Protocol: store.UDP, Addr: netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i/65535)}), Port: uint16(1 + i%65535)}, o
	})
}
