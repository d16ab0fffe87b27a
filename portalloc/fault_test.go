package portalloc_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// The faults below hit a running store: its directory turns read-only, its
// file is replaced by garbage, another program holds its write lock past the
// timeout, the caller cancels mid-wait, the disk fills up. In each, strict
// mode must fail with a clear ErrUnavailable, fallback mode must keep
// handing out locked, bind-probed ports from the MRU file where the store
// is broken (and log the switch once) and fail where it is only busy or
// short, and a reservation another process made before the fault must
// survive it. TestMain's goleak check covers leaked goroutines.

// faultRig is a state directory with a reservation held by another process
// and two Allocators of this process on it, one with fallback and one
// strict. They share the process's handle of the store, made by the first,
// whose Logger the handle logs to: the one with fallback.
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
	rig.fb = newOn(tb, portalloc.Config{StateDir: dir, Timeout: timeout, Logger: rig.log.logger()})
	rig.strict = newOn(tb, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Timeout: timeout})
	for _, a := range []*portalloc.Allocator{rig.strict, rig.fb} {
		r, err := a.Allocate(context.Background(), portalloc.Request{Label: "before"})
		if err != nil || a.Stats().Fallback != "" {
			tb.Fatalf("Allocate before the fault = %+v, %v", r, err)
		}
	}
	return rig
}

// expect checks both Allocators after a fault that breaks the store:
// strict fails with want in its message, fallback serves bindable ports
// from the MRU file and the switch is logged once.
func (rig *faultRig) expect(tb testing.TB, want string) {
	tb.Helper()
	ctx := context.Background()
	_, err := rig.strict.Allocate(ctx, portalloc.Request{})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), want) {
		tb.Errorf("strict Allocate = %v; want ErrUnavailable saying %q", err, want)
	}
	for range 3 {
		r, err := rig.fb.Allocate(ctx, portalloc.Request{})
		if err != nil || rig.fb.Stats().Fallback == "" {
			tb.Fatalf("fallback Allocate = %+v, %v (%+v); want a port from the MRU file", r, err, rig.fb.Stats())
		}
		if r.Port == rig.heldPort || !bindable(tb, r) {
			tb.Errorf("fallback Allocate = %v; want a bindable port, not the held %d", r, rig.heldPort)
		}
	}
	if n := rig.log.count("state store unavailable"); n != 1 {
		tb.Errorf("the fallback was logged %d times; want once. Log:\n%s", n, rig.log.dump())
	}
}

// expectHeldSurvives checks that the other process's reservation is still in
// the store once the fault is gone.
func (rig *faultRig) expectHeldSurvives(tb testing.TB) {
	tb.Helper()
	rows := storeRows(tb, rig.dir, store.Filter{Port: rig.heldPort})
	if len(rows) != 1 || rows[0].Label != "worker" {
		tb.Errorf("the other process's reservation of port %d after the fault: %+v", rig.heldPort, rows)
	}
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
	if err := runCmd("chattr", append([]string{"+i"}, paths...)...); err != nil {
		t.Skipf("skipping: %v", err)
	}
	t.Cleanup(func() { _ = runCmd("chattr", append([]string{"-i"}, paths...)...) })

	rig.expect(t, "is writable")
	if err := runCmd("chattr", append([]string{"-i"}, paths...)...); err != nil {
		t.Fatal(err)
	}
	rig.expectHeldSurvives(t)
}

// TestFaultDatabaseReplaced: someone replaces the database file with
// garbage mid-run. Writing on into the unlinked old file would hide every
// new reservation from other processes, so the store must notice; it cannot
// be opened again, so strict mode fails and fallback serves from the MRU
// file. A new Allocator must refuse the garbage without touching it.
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
	rig.expect(t, "was replaced")

	a := newAllocator(t, portalloc.Config{StateDir: dir})
	if st := a.Stats(); !strings.Contains(st.Fallback, store.ErrDamaged.Error()) {
		t.Errorf("new Allocator on garbage: Stats() = %+v; want a fallback because the file is damaged", st)
	}
	if _, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, IgnoreEnv: true}); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, store.ErrDamaged) {
		t.Errorf("New(strict) on garbage = %v; want ErrUnavailable wrapping ErrDamaged", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "berth.db")); !bytes.Equal(got, garbage) {
		t.Error("the garbage file was modified")
	}
}

// TestFaultForeignLock: a program outside berth holds the write lock for
// longer than the timeout. The store is busy, not broken: both Allocators
// fail with ErrUnavailable and neither falls back to the MRU file.
func TestFaultForeignLock(t *testing.T) {
	dir := t.TempDir()
	rig := newFaultRig(t, dir, time.Second)
	locker := holdSQLiteWriteLock(t, dir)
	for _, a := range []*portalloc.Allocator{rig.strict, rig.fb} {
		r, err := a.Allocate(context.Background(), portalloc.Request{})
		// Busy, or out of time behind the store's own sweep, which waits
		// for the same lock (see TestBusyStoreIsNotAFallback).
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, store.ErrBusy) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Allocate on a locked store = %+v, %v; want ErrUnavailable wrapping ErrBusy", r, err)
		}
	}
	if st := rig.fb.Stats(); st.Fallback != "" || rig.log.count("state store unavailable") != 0 {
		t.Errorf("a busy store made the Allocator fall back: %+v", st)
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
	holdSQLiteWriteLock(t, dir)
	for _, a := range []*portalloc.Allocator{rig.strict, rig.fb} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		_, err := a.Allocate(ctx, portalloc.Request{})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Allocate cancelled while waiting = %v; want context.Canceled", err)
		}
		cancel()
	}
	if st := rig.fb.Stats(); st.Fallback != "" || st.Fallbacks != 0 {
		t.Errorf("a cancelled call made the Allocator fall back: %+v", st)
	}
}

// TestFaultDiskFull: the state directory's file system fills up. A full
// disk is a passing shortage: both Allocators fail saying so, neither falls
// back, and the store serves again once there is space.
func TestFaultDiskFull(t *testing.T) {
	needRoot(t, "a full disk (a small tmpfs)")
	dir := t.TempDir()
	if err := runCmd("mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", dir); err != nil {
		t.Skipf("skipping: cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = runCmd("umount", "-l", dir) })
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
	if !errors.Is(err2, store.ErrUnavailable) || !errors.Is(err2, store.ErrTransient) || !strings.Contains(err2.Error(), "no space left") {
		t.Fatalf("strict Allocate on a full disk = %v; want ErrUnavailable and ErrTransient saying no space is left", err2)
	}
	for range 20000 {
		r, err := rig.fb.Allocate(ctx, portalloc.Request{})
		if err == nil {
			if rig.fb.Stats().Fallback != "" {
				t.Fatalf("fallback Allocate on a full disk = %+v; want no port from the MRU file", r)
			}
			continue
		}
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, store.ErrTransient) || !strings.Contains(err.Error(), "no space left") {
			t.Fatalf("fallback Allocate on a full disk = %v; want ErrUnavailable and ErrTransient saying no space is left", err)
		}
		break
	}
	if st := rig.fb.Stats(); st.Fallback != "" || st.Fallbacks != 0 || rig.log.count("state store unavailable") != 0 {
		t.Errorf("on a full disk the fallback Allocator fell back: %+v", st)
	}
	_ = os.Remove(filler)
	if r, err := rig.fb.Allocate(ctx, portalloc.Request{Label: "after"}); err != nil || rig.fb.Stats().Fallback != "" {
		t.Errorf("Allocate once space is free again = %+v, %v; want a port from the store", r, err)
	}
	rig.expectHeldSurvives(t)
}
