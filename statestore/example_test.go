package statestore_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// A store is shared by every process that opens the same file; this process
// reserves a port, lists the table, and releases it.
func Example() {
	dir, _ := os.MkdirTemp("", "berth-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	s, err := statestore.Open(ctx, filepath.Join(dir, "berth.db"), statestore.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	key := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 28000}
	if _, err := s.Reserve(ctx, store.Request{Key: key, Label: "db"}); err != nil {
		fmt.Println(err)
		return
	}
	rows, _ := s.List(ctx, store.Filter{})
	for _, r := range rows {
		fmt.Println(r.Key, r.Label, r.Kind, r.Owner.PID == os.Getpid())
	}
	fmt.Println(s.Release(ctx, key, store.Owner{}))
	// Output:
	// tcp 127.0.0.1:28000 db static true
	// <nil>
}

// Scan takes the first candidate that nobody holds and that passes the
// probe, inside one transaction.
func Example_scan() {
	dir, _ := os.MkdirTemp("", "berth-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := statestore.Open(ctx, filepath.Join(dir, "berth.db"), statestore.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	candidates := []uint16{28100, 28101, 28102}
	next := func() (uint16, bool) {
		if len(candidates) == 0 {
			return 0, false
		}
		p := candidates[0]
		candidates = candidates[1:]
		return p, true
	}
	probe := func(k store.Key) error { // pretend 28100 is bound
		if k.Port == 28100 {
			return &store.ConflictError{Key: k, Bound: true}
		}
		return nil
	}
	r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Next: next, Probe: probe})
	fmt.Println(r.Port, r.Kind, err)
	// Output:
	// 28101 dynamic <nil>
}
