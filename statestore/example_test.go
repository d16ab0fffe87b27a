package statestore_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/berth-go/berth/statestore"
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

	key := statestore.Key{Protocol: statestore.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 28000}
	if _, err := s.Reserve(ctx, statestore.Request{Key: key, Label: "db"}); err != nil {
		fmt.Println(err)
		return
	}
	rows, _ := s.List(ctx, statestore.Filter{})
	for _, r := range rows {
		fmt.Println(r.Key, r.Label, r.Kind, r.Owner.PID == os.Getpid())
	}
	fmt.Println(s.Release(ctx, key, statestore.Owner{}))
	// Output:
	// tcp 127.0.0.1:28000 db static true
	// <nil>
}

// Scan takes the first candidate that nobody holds and that passes the
// probe, inside one transaction.
func ExampleStore_Scan() {
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
	bound := func(k statestore.Key) (bool, error) { return k.Port != 28100, nil } // pretend 28100 is bound
	r, err := s.Scan(ctx, statestore.ScanRequest{Protocol: statestore.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Next: next, Probe: bound})
	fmt.Println(r.Port, r.Kind, err)
	// Output:
	// 28101 dynamic <nil>
}
