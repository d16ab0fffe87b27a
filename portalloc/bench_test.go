package portalloc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/store"
)

// benchAllocator opens an Allocator for a benchmark, on a state directory
// of its own, closed when b ends.
func benchAllocator(b *testing.B, cfg portalloc.Config) *portalloc.Allocator {
	b.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = b.TempDir()
	}
	if cfg.Range == (store.Range{}) {
		cfg.Range = allocRange
	}
	cfg.IgnoreEnv = true
	a, err := fleet.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

// BenchmarkAllocateRelease compares one Allocate+Release of each backend,
// each a grant that takes the port's kernel lock and bind-probes it, with
// a bare net.Listen("tcp", "127.0.0.1:0")+Close in the same run. postgres
// is a fleet's store (Config.StoreDSN) on the server BERTH_TEST_POSTGRES
// names, skipped without it.
func BenchmarkAllocateRelease(b *testing.B) {
	for _, mode := range []portalloc.Mode{portalloc.ModeStateStore, portalloc.ModeMRU} {
		b.Run(string(mode), func(b *testing.B) {
			allocateRelease(b, benchAllocator(b, portalloc.Config{Mode: mode}))
		})
	}
	b.Run("postgres", func(b *testing.B) {
		allocateRelease(b, benchAllocator(b, portalloc.Config{StoreDSN: fleetDSN(b), Host: "bench"}))
	})
	b.Run("listen", benchListen)
}

// BenchmarkReserveRelease is Reserve+Release of one port, over and over.
func BenchmarkReserveRelease(b *testing.B) {
	a := benchAllocator(b, portalloc.Config{Mode: portalloc.ModeStateStore})
	ctx := context.Background()
	port := freeRun(b, 1)
	for b.Loop() {
		r, err := a.Reserve(ctx, portalloc.Request{}, port)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Release(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkListen is Listen (a grant whose probe is the bind of the
// listener returned)+Close+Release, beside a bare listen.
func BenchmarkListen(b *testing.B) {
	b.Run("statestore", func(b *testing.B) {
		a := benchAllocator(b, portalloc.Config{Mode: portalloc.ModeStateStore})
		ctx := context.Background()
		for b.Loop() {
			r, l, err := a.Listen(ctx, portalloc.Request{})
			if err != nil {
				b.Fatal(err)
			}
			_ = l.Close()
			if err := a.Release(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("listen", benchListen)
}

// benchListen is a bare net.Listen("tcp", "127.0.0.1:0")+Close, what users
// compare berth with.
func benchListen(b *testing.B) {
	for b.Loop() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		_ = l.Close()
	}
}

// allocateRelease is the loop of the Allocate+Release benchmarks.
func allocateRelease(b *testing.B, a *portalloc.Allocator) {
	b.Helper()
	ctx := context.Background()
	for b.Loop() {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Release(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocateFull measures Allocate+Release on a 2,000-port range
// that is empty, 90% held by this process, and 90% held by another process.
func BenchmarkAllocateFull(b *testing.B) {
	const size, held = 2000, 1800
	rng := store.Range{First: allocRange.First, Last: allocRange.First + size - 1}
	cfg := func(dir string) portalloc.Config {
		return portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true}
	}
	b.Run("empty", func(b *testing.B) {
		allocateRelease(b, benchAllocator(b, cfg(b.TempDir())))
	})
	b.Run("90pct-self", func(b *testing.B) {
		a := benchAllocator(b, cfg(b.TempDir()))
		for range held {
			if _, err := a.Allocate(context.Background(), portalloc.Request{}); err != nil {
				b.Fatal(err)
			}
		}
		allocateRelease(b, a)
	})
	b.Run("90pct-other", func(b *testing.B) {
		dir := b.TempDir()
		spawn(b, "fill", "BERTH_STATE_DIR="+dir, "BERTH_TEST_RANGE="+rng.String(), "BERTH_TEST_N="+strconv.Itoa(held)).ready(b)
		allocateRelease(b, benchAllocator(b, cfg(dir)))
	})
}

// churnReport is what one contention worker prints when it is done.
type churnReport struct {
	Ops       int     `json:"ops"`
	Errors    int     `json:"errors"`
	Latencies []int64 `json:"latencies_ns"` // one Allocate+Release each
}

func init() {
	// churn allocates and releases in a loop for BERTH_TEST_DURATION, after
	// one byte on stdin says go, and prints a churnReport. With
	// BERTH_TEST_STORE it is a host (BERTH_TEST_HOST) of a fleet's store.
	workers["churn"] = func(ctx context.Context) error {
		d, err := time.ParseDuration(os.Getenv("BERTH_TEST_DURATION"))
		if err != nil {
			return err
		}
		cfg := workerConfig()
		cfg.StoreDSN, cfg.Host = os.Getenv("BERTH_TEST_STORE"), os.Getenv("BERTH_TEST_HOST")
		a, err := fleet.New(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		fmt.Println("ready")
		_, _ = os.Stdin.Read(make([]byte, 1))
		var rep churnReport
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			start := time.Now()
			r, err := a.Allocate(ctx, portalloc.Request{})
			if err == nil {
				err = a.Release(ctx, r)
			}
			rep.Latencies = append(rep.Latencies, int64(time.Since(start)))
			rep.Ops++
			if err != nil {
				rep.Errors++
			}
		}
		return json.NewEncoder(os.Stdout).Encode(rep)
	}
}

// BenchmarkContention runs processes that allocate and release on one
// store for two seconds, and reports their combined operations per second,
// the worst process's p99 and the slowest single call. An operation is one
// Allocate+Release. procs=1 is the latency of one process alone; 16
// processes on two cores show how the store shares out when processes
// outnumber cores many times. listen is a bare listen and close in the same
// run, to scale the latencies by.
func BenchmarkContention(b *testing.B) {
	for _, procs := range []int{1, 6, 16} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) { contention(b, procs) })
	}
	b.Run("listen", benchListen)
}

func contention(b *testing.B, procs int) {
	b.Helper()
	duration := 2 * time.Second
	for b.Loop() {
		dir := b.TempDir()
		ps := make([]*proc, procs)
		for i := range ps {
			ps[i] = spawn(b, "churn", "BERTH_STATE_DIR="+dir, "BERTH_TEST_DURATION="+duration.String()).ready(b)
		}
		runChurn(b, ps).report(b, duration)
	}
}

// churned sums the reports of churn processes.
type churned struct {
	ops, errs         int
	worstP99, slowest time.Duration
}

// runChurn starts the ready churn processes ps, waits for their reports and
// sums them.
func runChurn(b *testing.B, ps []*proc) churned {
	b.Helper()
	for _, p := range ps {
		_, _ = p.stdin.Write([]byte{1})
	}
	var c churned
	for _, p := range ps {
		var rep churnReport
		if err := json.NewDecoder(p.out).Decode(&rep); err != nil {
			b.Fatal(err)
		}
		_ = p.cmd.Wait()
		c.ops += rep.Ops
		c.errs += rep.Errors
		slices.Sort(rep.Latencies)
		if n := len(rep.Latencies); n > 0 {
			c.worstP99 = max(c.worstP99, time.Duration(rep.Latencies[n*99/100]))
			c.slowest = max(c.slowest, time.Duration(rep.Latencies[n-1]))
		}
	}
	return c
}

// report fails b on errors and reports the rate, the worst p99 and the
// slowest call over duration.
func (c churned) report(b *testing.B, duration time.Duration) {
	b.Helper()
	if c.errs > 0 {
		b.Errorf("%d of %d operations failed", c.errs, c.ops)
	}
	b.ReportMetric(float64(c.ops)/duration.Seconds(), "ops/s")
	b.ReportMetric(float64(c.worstP99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(c.slowest.Microseconds())/1000, "max-ms")
}

// BenchmarkPool compares Take+Return on a warm pool with Allocate+Release
// in the same run.
func BenchmarkPool(b *testing.B) {
	ctx := context.Background()
	a := benchAllocator(b, portalloc.Config{Mode: portalloc.ModeStateStore})
	b.Run("take-return", func(b *testing.B) {
		p, err := pool.New(ctx, a, "bench", pool.Spec{Size: 8})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		for b.Loop() {
			r, err := p.Take(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Return(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("allocate-release", func(b *testing.B) { allocateRelease(b, a) })
}
