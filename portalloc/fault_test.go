package portalloc_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
)

// The faults below hit a running store: its directory turns read-only, its
// file is replaced by garbage, another program holds its write lock past the
// timeout, the caller cancels mid-wait, the disk fills up. In each, strict
// mode must fail with a clear ErrStoreUnavailable, fallback mode must keep
// handing out bind-probed ports from the MRU file and log the switch once,
// and a reservation another process made before the fault must survive it.
// TestMain's goleak check covers leaked goroutines.

// logCounter is a logr sink that counts messages containing a phrase.
type logCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *logCounter) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		c.mu.Lock()
		c.lines = append(c.lines, args)
		c.mu.Unlock()
	}, funcr.Options{})
}

func (c *logCounter) count(phrase string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if strings.Contains(l, phrase) {
			n++
		}
	}
	return n
}

// faultRig is a state directory with a reservation held by another process
// and two Allocators on it, one strict and one with fallback.
type faultRig struct {
	dir        string
	heldPort   uint16
	strict, fb *portalloc.Allocator
	log        *logCounter
}

func newFaultRig(tb testing.TB, dir string, timeout time.Duration) *faultRig {
	tb.Helper()
	rig := &faultRig{dir: dir, heldPort: freeRun(tb, 1), log: &logCounter{}}
	holdInWorker(tb, dir, lo4, rig.heldPort)
	// Close may fail after a fault (the store cannot release); its error
	// is for logging, so these Allocators are closed without checking it.
	for _, cfg := range []struct {
		dst **portalloc.Allocator
		cfg portalloc.Config
	}{
		{&rig.strict, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange, Timeout: timeout}},
		{&rig.fb, portalloc.Config{StateDir: dir, Range: allocRange, Timeout: timeout, Logger: rig.log.logger()}},
	} {
		a, err := portalloc.New(context.Background(), cfg.cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = a.Close() })
		*cfg.dst = a
	}
	for _, a := range []*portalloc.Allocator{rig.strict, rig.fb} {
		r, err := a.Allocate(context.Background(), portalloc.Request{})
		if err != nil || r.Backend != portalloc.BackendStateStore {
			tb.Fatalf("Allocate before the fault = %+v, %v", r, err)
		}
	}
	return rig
}

// expect checks both Allocators after the fault: strict fails with want in
// its message, fallback serves bindable MRU ports and logs the switch once.
func (rig *faultRig) expect(tb testing.TB, want string) {
	tb.Helper()
	ctx := context.Background()
	_, err := rig.strict.Allocate(ctx, portalloc.Request{})
	if !errors.Is(err, portalloc.ErrStoreUnavailable) || !strings.Contains(err.Error(), want) {
		tb.Errorf("strict Allocate = %v; want ErrStoreUnavailable saying %q", err, want)
	}
	for range 3 {
		r, err := rig.fb.Allocate(ctx, portalloc.Request{})
		if err != nil || r.Backend != portalloc.BackendMRU {
			tb.Fatalf("fallback Allocate = %+v, %v; want a port from the MRU file", r, err)
		}
		_ = listen(tb, r.Addr, r.Port).Close()
	}
	if n := rig.log.count("state store unavailable"); n != 1 {
		tb.Errorf("the fallback was logged %d times; want once", n)
	}
}

// expectHeldSurvives checks that the other process's reservation is still in
// the store once the fault is gone.
func (rig *faultRig) expectHeldSurvives(tb testing.TB) {
	tb.Helper()
	s, err := statestore.Open(context.Background(), filepath.Join(rig.dir, "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		tb.Fatalf("reopen after the fault: %v", err)
	}
	defer s.Close()
	rows, err := s.List(context.Background(), statestore.Filter{Port: rig.heldPort})
	if err != nil || len(rows) != 1 || rows[0].Label != "worker" {
		tb.Errorf("the other process's reservation of port %d after the fault: %+v, %v", rig.heldPort, rows, err)
	}
}

func needRoot(tb testing.TB, what string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skipf("skipping: simulating %s needs root", what)
	}
}

func run(tb testing.TB, name string, args ...string) error {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// TestFaultReadOnlyStateDir: the state directory and the files berth writes
// through become immutable mid-run (chattr +i refuses writes even on open
// descriptors). The -shm file is left alone: SQLite maps it into memory,
// and a write through a mapping of an immutable file is a SIGBUS, which no
// real change of a directory to read-only produces (chmod leaves open
// mappings writable; a read-only remount is refused while files are open).
func TestFaultReadOnlyStateDir(t *testing.T) {
	needRoot(t, "a read-only directory for a process that has its files open")
	if _, err := exec.LookPath("chattr"); err != nil {
		t.Skip("skipping: no chattr on this host")
	}
	dir := t.TempDir()
	rig := newFaultRig(t, dir, 2*time.Second)

	entries, _ := os.ReadDir(dir)
	paths := []string{dir}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "-shm") {
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	if err := run(t, "chattr", append([]string{"+i"}, paths...)...); err != nil {
		t.Skipf("skipping: %v", err)
	}
	t.Cleanup(func() { _ = run(t, "chattr", append([]string{"-i"}, paths...)...) })

	rig.expect(t, "is writable")
	if err := run(t, "chattr", append([]string{"-i"}, paths...)...); err != nil {
		t.Fatal(err)
	}
	rig.expectHeldSurvives(t)
}

// TestFaultDatabaseReplaced: someone replaces the database file with
// garbage mid-run. Writing on into the unlinked old file would hide every
// new reservation from other processes, so the store must notice; a new
// Allocator must refuse the garbage without touching it.
func TestFaultDatabaseReplaced(t *testing.T) {
	dir := t.TempDir()
	rig := newFaultRig(t, dir, 2*time.Second)
	garbage := bytes.Repeat([]byte("not a database "), 300)
	tmp := filepath.Join(dir, "garbage")
	if err := os.WriteFile(tmp, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "berth.db")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := rig.strict.Allocate(ctx, portalloc.Request{}); !errors.Is(err, portalloc.ErrStoreUnavailable) || !strings.Contains(err.Error(), "was replaced") {
		t.Errorf("strict Allocate = %v; want ErrStoreUnavailable saying the file was replaced", err)
	}
	// The fallback cannot read the garbage to skip the ports the store
	// holds: it hands out none.
	if r, err := rig.fb.Allocate(ctx, portalloc.Request{}); !errors.Is(err, portalloc.ErrStoreUnavailable) || !strings.Contains(err.Error(), "cannot read the store") {
		t.Errorf("fallback Allocate = %+v, %v; want ErrStoreUnavailable saying the store cannot be read", r, err)
	}
	if n := rig.log.count("state store unavailable"); n != 1 {
		t.Errorf("the fallback was logged %d times; want once", n)
	}

	a := newAllocator(t, portalloc.Config{StateDir: dir})
	if a.Backend() != portalloc.BackendMRU || !errors.Is(a.FallbackCause(), statestore.ErrDamaged) {
		t.Errorf("new Allocator on garbage: backend %s, cause %v; want mru because the file is damaged", a.Backend(), a.FallbackCause())
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "berth.db")); !bytes.Equal(got, garbage) {
		t.Error("the garbage file was modified")
	}
}

// holdWriteLock holds a write transaction on db the way a program outside
// berth would, until stdin closes.
func holdWriteLock(ctx context.Context, db string) error {
	conn, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer conn.Close()
	c, err := conn.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_, err = c.ExecContext(ctx, "ROLLBACK")
	return err
}

func startLocker(tb testing.TB, dir string) io.Closer {
	tb.Helper()
	return spawn(tb, "locker", "BERTH_STATE_DIR="+dir).ready(tb).stdin
}

// TestFaultForeignLock: a program outside berth holds the write lock for
// longer than the timeout. The store is busy, not broken: both Allocators
// fail with ErrStoreUnavailable and neither falls back to the MRU file,
// which would hand out ports without reserving them.
func TestFaultForeignLock(t *testing.T) {
	dir := t.TempDir()
	rig := newFaultRig(t, dir, time.Second)
	locker := startLocker(t, dir)
	start := time.Now()
	for _, a := range []*portalloc.Allocator{rig.strict, rig.fb} {
		r, err := a.Allocate(context.Background(), portalloc.Request{})
		if !errors.Is(err, portalloc.ErrStoreUnavailable) || !errors.Is(err, statestore.ErrBusy) || !strings.Contains(err.Error(), "locked by another process") {
			t.Errorf("Allocate on a locked store = %+v, %v; want ErrStoreUnavailable wrapping ErrBusy", r, err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the calls took %v with a 1s timeout", d)
	}
	if rig.fb.Backend() != portalloc.BackendStateStore || rig.log.count("state store unavailable") != 0 {
		t.Errorf("a busy store made the Allocator fall back: backend %s", rig.fb.Backend())
	}
	_ = locker.Close()
	rig.expectHeldSurvives(t)
}

// TestFaultCancelWhileWaiting: the caller gives up while the store waits
// for a lock. That is the caller's choice, not a store failure: the error
// is the context's and there is no fallback.
func TestFaultCancelWhileWaiting(t *testing.T) {
	dir := t.TempDir()
	rig := newFaultRig(t, dir, 30*time.Second)
	startLocker(t, dir)
	for _, a := range []*portalloc.Allocator{rig.strict, rig.fb} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		start := time.Now()
		_, err := a.Allocate(ctx, portalloc.Request{})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Allocate cancelled while waiting = %v; want context.Canceled", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Allocate returned %v after cancellation", d)
		}
		cancel()
	}
	if rig.fb.Backend() != portalloc.BackendStateStore {
		t.Error("a cancelled call made the Allocator fall back")
	}
}

// TestFaultDiskFull: the state directory's file system fills up.
func TestFaultDiskFull(t *testing.T) {
	needRoot(t, "a full disk (a small tmpfs)")
	dir := t.TempDir()
	if err := run(t, "mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", dir); err != nil {
		t.Skipf("skipping: cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = run(t, "umount", "-l", dir) })
	rig := newFaultRig(t, dir, 2*time.Second)

	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	for {
		if _, err := f.Write(chunk[:512]); err != nil {
			break
		}
	}
	_ = f.Close()

	// The WAL has room left in pages it already has; allocate until the
	// store needs a new one.
	ctx := context.Background()
	var err2 error
	for range 20000 {
		if _, err2 = rig.strict.Allocate(ctx, portalloc.Request{}); err2 != nil {
			break
		}
	}
	if !errors.Is(err2, portalloc.ErrStoreUnavailable) || !strings.Contains(err2.Error(), "full") {
		t.Fatalf("strict Allocate on a full disk = %v; want ErrStoreUnavailable saying full", err2)
	}
	if !errors.Is(err2, portalloc.ErrTransient) || !strings.Contains(err2.Error(), "no space left") {
		t.Errorf("strict Allocate on a full disk = %v; want ErrTransient saying no space is left", err2)
	}
	// A full disk is a passing shortage, not a broken store: the
	// fallback Allocator fails the call too, and does not fall back.
	for range 20000 {
		r, err := rig.fb.Allocate(ctx, portalloc.Request{})
		if err == nil {
			if r.Backend != portalloc.BackendStateStore {
				t.Fatalf("fallback Allocate on a full disk = %+v; want no port from the MRU file", r)
			}
			continue
		}
		if !errors.Is(err, portalloc.ErrStoreUnavailable) || !errors.Is(err, portalloc.ErrTransient) || !strings.Contains(err.Error(), "no space left") {
			t.Fatalf("fallback Allocate on a full disk = %v; want ErrStoreUnavailable and ErrTransient saying no space is left", err)
		}
		break
	}
	if rig.fb.Backend() != portalloc.BackendStateStore || rig.fb.Stats().Fallbacks != 0 {
		t.Errorf("on a full disk the fallback Allocator switched to %s (%d fallbacks); want it to stay on the store", rig.fb.Backend(), rig.fb.Stats().Fallbacks)
	}
	if n := rig.log.count("state store unavailable"); n != 0 {
		t.Errorf("a fallback was logged %d times; want none", n)
	}
	_ = os.Remove(filler)
	if r, err := rig.fb.Allocate(ctx, portalloc.Request{}); err != nil || r.Backend != portalloc.BackendStateStore {
		t.Errorf("Allocate once space is free again = %+v, %v; want a port from the store", r, err)
	}
	rig.expectHeldSurvives(t)
}
