package mru_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portlock"
)

// BenchmarkRecord is the file's cost in one call (lock, read what others
// appended, append a line), with the file already holding 0 or 10,000
// unexpired records: it must not grow with the file. The second File, as a
// fresh process would have, reads the records once, in its first call.
func BenchmarkRecord(b *testing.B) {
	for _, records := range []int{0, 10000} {
		b.Run(fmt.Sprintf("records=%d", records), func(b *testing.B) {
			ctx := context.Background()
			opts := mru.Options{MaxEntries: 4 * max(records, 1000), Window: time.Hour}
			path := filepath.Join(b.TempDir(), "mru.json")
			f := mru.New(path, opts)
			defer f.Close()
			for i := range records {
				if err := f.Record(ctx, "udp", uint16(1+i)); err != nil {
					b.Fatal(err)
				}
			}
			g := mru.New(path, opts)
			defer g.Close()
			i := 0
			for b.Loop() {
				i++
				if err := g.Record(ctx, "tcp", uint16(1+i%65535)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAllocate is one Allocate with a real bind probe on 127.0.0.1 in
// mru's test range (internal/testports); BenchmarkListen, a bare listen and
// close on port 0, is the yardstick.
func BenchmarkAllocate(b *testing.B) {
	ctx := context.Background()
	// A short window, so that the range never runs out of ports that were
	// not handed out recently.
	f := mru.New(filepath.Join(b.TempDir(), "mru.json"), mru.Options{Window: time.Millisecond})
	defer f.Close()
	r, i := testports.Mru, 0
	next := func() (uint16, bool) { i++; return r.First + uint16(i%r.Size()), true }
	probeTCP := func(p uint16) (bool, error) { return portlock.Probe("tcp", lo, p) }
	for b.Loop() {
		if _, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: next, Probe: probeTCP}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkListen(b *testing.B) {
	for b.Loop() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		_ = l.Close()
	}
}
