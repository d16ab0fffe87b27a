//go:build unix

package portalloc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

func init() {
	// grind allocates, binds what it got for a moment, and releases, in a
	// loop until stdin closes: most of the time it is inside a store
	// transaction or holds a bound port, so a SIGSTOP at a random moment
	// often freezes it there.
	workers["grind"] = func(ctx context.Context) error {
		cfg := workerConfig()
		cfg.Mode = portalloc.ModeStateStoreWithFallback
		a, err := portalloc.New(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		stop := make(chan struct{})
		go func() { _, _ = os.Stdin.Read(make([]byte, 1)); close(stop) }()
		fmt.Println("ready")
		for {
			select {
			case <-stop:
				return nil
			default:
			}
			r, err := a.Allocate(ctx, portalloc.Request{Label: "grind"})
			if err != nil {
				continue // a busy store while the test freezes others
			}
			l, err := net.Listen("tcp", r.AddrPort().String())
			if err != nil {
				return fmt.Errorf("granted %v, which is not bindable: %w", r, err)
			}
			_ = l.Close()
			_ = a.Release(ctx, r)
		}
	}
}

// TestFrozenLockHolder: a process stopped with SIGSTOP at a random moment,
// often while it holds the store's write lock, a port's kernel lock or a
// bound port, again and again. No call of another process (New, Allocate,
// Reserve, Release, Close) hangs, and every port it is granted binds: none
// is handed out twice.
func TestFrozenLockHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("25 freezes take a while")
	}
	dir := t.TempDir()
	const timeout = 400 * time.Millisecond
	// A hang, not a slow call: each call is bounded by Timeout; this is
	// what a loaded machine may add to it, many times over.
	const hang = timeout + 10*time.Second
	w := spawn(t, "grind", "BERTH_STATE_DIR="+dir).ready(t)
	defer func() { _ = w.cmd.Process.Signal(syscall.SIGCONT) }()

	// within runs f and fails the test if it has not returned by hang.
	var slowest time.Duration
	within := func(i int, what string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- f() }()
		select {
		case err := <-done:
			slowest = max(slowest, time.Since(start))
			return err
		case <-time.After(hang):
			t.Fatalf("freeze %d: %s hangs (no return in %v)", i, what, hang)
			return nil
		}
	}
	var granted, busy int
	for i := range 25 {
		time.Sleep(rand.N(20 * time.Millisecond))
		if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		cfg := portalloc.Config{StateDir: dir, Range: allocRange, Timeout: timeout, IgnoreEnv: true, Logger: (&logCounter{}).logger()}
		var a *portalloc.Allocator
		err := within(i, "New", func() (err error) {
			a, err = portalloc.New(ctx, cfg)
			return err
		})
		if err != nil {
			busy++
			t.Logf("freeze %d: New: %v", i, err)
		} else {
			var rs []store.Reservation
			if err := within(i, "Allocate", func() error {
				r, err := a.Allocate(ctx, portalloc.Request{Label: "frozen-test"})
				if err == nil {
					rs = append(rs, r)
				}
				return err
			}); err != nil {
				busy++
			}
			port := allocRange.First + uint16(rand.IntN(int(allocRange.Last-allocRange.First)))
			if err := within(i, "Reserve", func() error {
				r, err := a.Reserve(ctx, portalloc.Request{Label: "frozen-test"}, port)
				if err == nil {
					rs = append(rs, r)
				}
				return err
			}); err != nil {
				busy++
			}
			for _, r := range rs {
				granted++
				if !bindable(t, r) {
					t.Errorf("freeze %d: granted %v, which is not bindable", i, r)
					continue
				}
				_ = within(i, "Release", func() error { return a.Release(ctx, r) })
			}
			_ = within(i, "Close", a.Close)
		}
		if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("25 freezes: %d ports granted and bound, %d calls ended busy; the slowest call took %v", granted, busy, slowest)
	if granted == 0 {
		t.Error("no port was granted in 25 freezes; the test proved nothing")
	}
}
