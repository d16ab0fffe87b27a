package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

func init() {
	// flocker takes the store's write lock (the flock of berth.db.lock
	// in BERTH_STATE_DIR, which every write of the store takes first),
	// prints "ready" and holds it until stdin closes: stopped with
	// SIGSTOP, it is a lock holder frozen in the middle of a write.
	workers["flocker"] = func(context.Context) error {
		f, err := os.OpenFile(filepath.Join(os.Getenv("BERTH_STATE_DIR"), "berth.db.lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			return err
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	}
}

// starve keeps every core busy with two busy loops each, at normal
// priority, until the test ends.
func starve(t *testing.T) {
	t.Helper()
	for range 2 * runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}

// TestBoundedWhenStarved: with the store's lock held by a frozen process
// and every core busy, each call returns within Config.Timeout plus a
// second, with an error that says the store is busy, many times over.
func TestBoundedWhenStarved(t *testing.T) {
	if testing.Short() {
		t.Skip("keeps every core busy")
	}
	ctx := context.Background()
	dir := t.TempDir()
	const timeout = 2 * time.Second
	// The store exists before its lock is taken.
	seed := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Timeout: timeout})
	r, err := seed.Allocate(ctx, portalloc.Request{Label: "before"})
	if err != nil {
		t.Fatal(err)
	}
	locker := spawn(t, "flocker", "BERTH_STATE_DIR="+dir).ready(t)
	if err := locker.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.cmd.Process.Signal(syscall.SIGCONT) })
	starve(t)

	a := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Timeout: timeout})
	calls := map[string]func() error{
		"Allocate": func() error { _, err := a.Allocate(ctx, portalloc.Request{Label: "starved"}); return err },
		"Reserve":  func() error { _, err := a.Reserve(ctx, portalloc.Request{}, pickRange.First); return err },
		"Release":  func() error { return seed.Release(ctx, r) },
		"Reap":     func() error { _, err := a.Reap(ctx); return err },
		"New": func() error {
			b, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Range: allocRange, Timeout: timeout, IgnoreEnv: true})
			if err == nil {
				_, err = b.Allocate(ctx, portalloc.Request{})
				_ = b.Close()
			}
			return err
		},
	}
	rounds := 4
	if raceEnabled {
		rounds = 2
	}
	for round := range rounds {
		for name, call := range calls {
			start := time.Now()
			err := call()
			took := time.Since(start)
			if took > timeout+time.Second {
				t.Errorf("round %d: %s took %v with the store's lock frozen and every core busy; want at most %v", round, name, took, timeout+time.Second)
			}
			if name == "Release" || name == "Reap" {
				// Release may give up quietly (reaping covers it), and
				// a Reap that finds nothing to delete writes nothing.
				continue
			}
			busy := errors.Is(err, store.ErrBusy) || errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
			if !busy {
				t.Errorf("round %d: %s = %v; want an error saying the store is busy", round, name, err)
			}
		}
	}
}
