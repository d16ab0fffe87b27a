//go:build unix

package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
)

func init() {
	// grind allocates, binds what it got for a moment, and releases, in a
	// loop until stdin closes: most of the time it is inside a store
	// transaction or holds a bound port, so a SIGSTOP at a random moment
	// often freezes it there.
	workers["grind"] = func(ctx context.Context) error {
		a, err := portalloc.New(ctx, portalloc.Config{StateDir: os.Getenv("BERTH_STATE_DIR"), Range: allocRange})
		if err != nil {
			return err
		}
		defer a.Close()
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
// often while it holds the store's write lock or a bound port, 50 times.
// Every call of another process (New, Allocate, Reserve, Release, Close)
// returns within its Timeout and a margin, none hangs, and every port it is
// granted binds: none is handed out twice.
func TestFrozenLockHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("50 freezes take a while")
	}
	dir := t.TempDir()
	const timeout = 400 * time.Millisecond
	const margin = 2 * time.Second
	w := spawn(t, "grind", "BERTH_STATE_DIR="+dir).ready(t)
	defer func() { _ = w.cmd.Process.Signal(syscall.SIGCONT) }()

	// within runs f and fails the test if it has not returned by the bound.
	within := func(i int, what string, bound time.Duration, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- f() }()
		select {
		case err := <-done:
			if took := time.Since(start); took > bound {
				t.Errorf("freeze %d: %s took %v; want at most %v", i, what, took, bound)
			}
			return err
		case <-time.After(bound + 10*time.Second):
			t.Fatalf("freeze %d: %s hangs (no return in %v)", i, what, bound+10*time.Second)
			return nil
		}
	}
	var granted, busy int
	for i := range 50 {
		time.Sleep(rand.N(20 * time.Millisecond))
		if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		cfg := portalloc.Config{StateDir: dir, Range: allocRange, Timeout: timeout}
		var a *portalloc.Allocator
		err := within(i, "New", timeout+margin, func() (err error) {
			a, err = portalloc.New(ctx, cfg)
			return err
		})
		if err != nil {
			busy++
			t.Logf("freeze %d: New: %v", i, err)
		} else {
			var rs []portalloc.Reservation
			err := within(i, "Allocate", timeout+margin, func() error {
				r, err := a.Allocate(ctx, portalloc.Request{Label: "frozen-test"})
				if err == nil {
					rs = append(rs, r)
				}
				return err
			})
			if err != nil {
				busy++
				if !errors.Is(err, portalloc.ErrStoreUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
					t.Logf("freeze %d: Allocate: %v", i, err)
				}
			}
			port := allocRange.First + uint16(rand.IntN(int(allocRange.Last-allocRange.First)))
			if err := within(i, "Reserve", timeout+margin, func() error {
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
				l, err := net.Listen("tcp", r.AddrPort().String())
				if err != nil {
					t.Errorf("freeze %d: granted %v (%s), which is not bindable: %v", i, r, r.Backend, err)
					continue
				}
				_ = l.Close()
				_ = within(i, "Release", timeout+margin, func() error { return a.Release(ctx, r) })
			}
			_ = within(i, "Close", 2*timeout+margin, a.Close)
		}
		if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("50 freezes: %d ports granted and bound, %d calls ended busy", granted, busy)
	if granted == 0 {
		t.Error("no port was granted in 50 freezes; the test proved nothing")
	}
}
