package portalloc_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
)

func init() {
	// first times what a fresh process pays for its first port from a
	// store that exists: New, then one Allocate. Then, in the same process,
	// the median of 200 warm net.Listen+Close, to compare it with.
	workers["first"] = func(ctx context.Context) error {
		var rep firstReport
		start := time.Now()
		a, err := portalloc.New(ctx, workerConfig())
		if err != nil {
			return err
		}
		rep.NewNS = int64(time.Since(start))
		r, err := a.Allocate(ctx, portalloc.Request{})
		if err != nil {
			return err
		}
		rep.FirstNS = int64(time.Since(start))
		if err := a.Release(ctx, r); err != nil {
			return err
		}
		if err := a.Close(); err != nil {
			return err
		}
		listens := make([]int64, 200)
		for i := range listens {
			t := time.Now()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			_ = l.Close()
			listens[i] = int64(time.Since(t))
		}
		slices.Sort(listens)
		rep.ListenNS = listens[len(listens)/2]
		return json.NewEncoder(os.Stdout).Encode(rep)
	}
}

// firstReport is what a "first" worker prints.
type firstReport struct {
	NewNS    int64 `json:"new_ns"`    // portalloc.New
	FirstNS  int64 `json:"first_ns"`  // New and the first Allocate
	ListenNS int64 `json:"listen_ns"` // a warm net.Listen+Close, median
}

// BenchmarkFirstAllocate starts a fresh process per iteration that opens an
// Allocator on an existing store and allocates one port, timed from inside
// the process (its own start-up is not counted). It reports the medians over
// the iterations: New alone, New plus the first Allocate, a warm listen in
// the same processes, and the first call as a multiple of that listen.
// ns/op is the whole process's life, start-up included.
func BenchmarkFirstAllocate(b *testing.B) {
	dir := b.TempDir()
	a, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange, IgnoreEnv: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := a.Close(); err != nil {
		b.Fatal(err)
	}
	var news, firsts, listens []int64
	for b.Loop() {
		p := spawn(b, "first", "BERTH_STATE_DIR="+dir)
		var rep firstReport
		if err := json.NewDecoder(p.out).Decode(&rep); err != nil {
			b.Fatalf("first worker: %v", err)
		}
		if err := p.cmd.Wait(); err != nil {
			b.Fatalf("first worker: %v", err)
		}
		news = append(news, rep.NewNS)
		firsts = append(firsts, rep.FirstNS)
		listens = append(listens, rep.ListenNS)
	}
	med := func(v []int64) float64 {
		slices.Sort(v)
		return float64(v[len(v)/2])
	}
	n, f, l := med(news), med(firsts), med(listens)
	b.ReportMetric(n/1e3, "new-µs")
	b.ReportMetric(f/1e3, "first-µs")
	b.ReportMetric(l/1e3, "listen-µs")
	b.ReportMetric(f/l, "first/listen")
}
