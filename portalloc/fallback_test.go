package portalloc_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/statestore"
)

// The MRU file reserves nothing, so the fallback to it must never hand out
// a port the state store holds while the store can still be read, and must
// never be taken for a store that is merely busy.

func init() {
	workers["flock"] = holdFlock
}

// holdFlock holds the store's write lock, <db>.lock, as a berth process
// stuck in a transaction would, until stdin closes.
func holdFlock(context.Context) error {
	l, err := filelock.Open(filepath.Join(os.Getenv("BERTH_STATE_DIR"), "berth.db") + ".lock")
	if err != nil {
		return err
	}
	defer l.Close()
	if err := l.Lock(); err != nil {
		return err
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// dump returns every line logged.
func (c *logCounter) dump() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// setSchemaVersion sets the schema version recorded in dir's store, as a
// newer (or, to undo it, this) berth would have written it. A newer one
// comes with a newer write version: a change this berth must not write to.
func setSchemaVersion(tb testing.TB, dir string, v uint) {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "berth.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	w := statestore.WriteVersion
	if v > statestore.SchemaVersion {
		w++
	}
	if _, err := db.Exec(fmt.Sprintf("UPDATE schema_migrations SET version = %d; PRAGMA user_version = %d", v, w)); err != nil {
		tb.Fatal(err)
	}
}

// newerStore makes dir's store one a newer berth wrote: this berth can
// read it but not write to it, and falls back to the MRU file.
func newerStore(tb testing.TB, dir string) {
	tb.Helper()
	s, err := statestore.Open(context.Background(), filepath.Join(dir, statedir.DatabaseFile), statestore.Options{SweepInterval: -1})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Close(); err != nil {
		tb.Fatal(err)
	}
	setSchemaVersion(tb, dir, statestore.SchemaVersion+1)
}

// TestFallbackSkipsPortsTheStoreHolds: another process holds a port in the
// store; then a newer berth upgrades the store's schema, so this berth
// cannot write to it and falls back. The database can still be read, and
// the MRU file must not hand out the held port, neither to Allocate in a
// range where it is the only other port nor to Reserve, though it is
// bindable (a reservation is not a bind). Once the database cannot be read
// either, the default mode hands out nothing, and only ModeMRU serves
// blind, and says so.
func TestFallbackSkipsPortsTheStoreHolds(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := freeRun(t, 2)
	held, other := base, base+1
	pid := holdInWorker(t, dir, lo4, held).cmd.Process.Pid
	setSchemaVersion(t, dir, statestore.SchemaVersion+1)

	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Range: portalloc.Range{First: held, Last: other}, Logger: log.logger()})
	if a.Backend() != portalloc.BackendMRU || !errors.Is(a.FallbackCause(), statestore.ErrSchemaTooNew) {
		t.Fatalf("Allocator on a newer schema: backend %s, cause %v; want mru because the schema is too new", a.Backend(), a.FallbackCause())
	}
	if n := log.count("state store unavailable"); n != 1 {
		t.Errorf("the fallback was logged %d times; want once", n)
	}

	_, err := a.Reserve(ctx, portalloc.Request{}, held)
	var ce *portalloc.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != pid {
		t.Errorf("Reserve(%d) in the fallback = %v; want ErrPortHeld naming pid %d, which holds it in the store", held, err, pid)
	}
	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil || r.Port != other || r.Backend != portalloc.BackendMRU {
		t.Fatalf("Allocate in the fallback = %+v, %v; want port %d from the MRU file", r, err, other)
	}
	// other is now recently handed out, held is the store's: nothing left.
	if r, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, portalloc.ErrRangeExhausted) {
		t.Fatalf("second Allocate in the fallback = %+v, %v; want ErrRangeExhausted (port %d is held in the store). Log:\n%s", r, err, held, log.dump())
	}
	if st := a.Stats(); st.Blind != 0 || st.Fallbacks != 1 {
		t.Errorf("Stats() = %+v; want one fallback and nothing served blind", st)
	}

	// Garbage in place of the database: it cannot be read either.
	if err := os.WriteFile(filepath.Join(dir, "garbage"), bytes.Repeat([]byte("not a database "), 300), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "garbage"), filepath.Join(dir, "berth.db")); err != nil {
		t.Fatal(err)
	}
	// In the default mode the MRU file then hands out nothing.
	r, err = a.Allocate(ctx, portalloc.Request{})
	if !errors.Is(err, portalloc.ErrStoreUnavailable) || !strings.Contains(err.Error(), "cannot read the store") {
		t.Fatalf("Allocate in the fallback with a store it cannot read = %+v, %v; want ErrStoreUnavailable saying the store cannot be read", r, err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, held); !errors.Is(err, portalloc.ErrStoreUnavailable) {
		t.Errorf("Reserve(%d) in the fallback with a store it cannot read = %v; want ErrStoreUnavailable", held, err)
	}
	if st := a.Stats(); st.Blind != 0 {
		t.Errorf("Stats().Blind = %d; want 0: the default mode never serves blind", st.Blind)
	}
	// ModeMRU serves blind, on purpose, and says so.
	m := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeMRU, Range: portalloc.Range{First: held, Last: other}, Logger: log.logger()})
	r, err = m.Allocate(ctx, portalloc.Request{})
	if err != nil || r.Port != held {
		t.Fatalf("ModeMRU Allocate serving blind = %+v, %v; want port %d, the only one not recently handed out", r, err, held)
	}
	if st := m.Stats(); st.Blind != 1 {
		t.Errorf("Stats().Blind = %d; want 1", st.Blind)
	}
	if n := log.count("serves blind"); n != 1 {
		t.Errorf("serving blind was logged %d times; want once", n)
	}
}

// TestFallbackRetriesTheStore: a fallback lasts until the store can be
// used again, not for the Allocator's life.
func TestFallbackRetriesTheStore(t *testing.T) {
	defer portalloc.SetStoreRetryInterval(20 * time.Millisecond)()
	ctx := context.Background()
	dir := t.TempDir()
	newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir}) // creates the store
	setSchemaVersion(t, dir, statestore.SchemaVersion+1)
	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Logger: log.logger()})
	if a.Backend() != portalloc.BackendMRU {
		t.Fatalf("Backend() = %s; want mru", a.Backend())
	}
	setSchemaVersion(t, dir, statestore.SchemaVersion)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Backend == portalloc.BackendStateStore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Allocator still serves from the MRU file 10s after the store was fixed; cause %v", a.FallbackCause())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a.Backend() != portalloc.BackendStateStore || a.FallbackCause() != nil {
		t.Errorf("after the retry: backend %s, cause %v; want the store", a.Backend(), a.FallbackCause())
	}
	if n := log.count("usable again"); n != 1 {
		t.Errorf("the return to the store was logged %d times; want once", n)
	}
}

// TestBusyStoreIsNotAFallback: another berth process holds the store's
// write lock past the timeout. The store is busy, not broken: Allocate and
// Reserve fail with ErrStoreUnavailable wrapping ErrBusy, and the Allocator
// goes on with the store, which serves again once the lock is free.
func TestBusyStoreIsNotAFallback(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir}) // creates the store
	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Timeout: time.Second, Logger: log.logger()})
	locker := spawn(t, "flock", "BERTH_STATE_DIR="+dir).ready(t)

	r, err := a.Allocate(ctx, portalloc.Request{})
	if !errors.Is(err, portalloc.ErrStoreUnavailable) || !errors.Is(err, statestore.ErrBusy) {
		t.Errorf("Allocate on a busy store = %+v, %v; want ErrStoreUnavailable wrapping ErrBusy", r, err)
	}
	if err != nil && !strings.Contains(err.Error(), fmt.Sprint(locker.cmd.Process.Pid)) {
		t.Logf("the error does not name the lock's holder, pid %d: %v", locker.cmd.Process.Pid, err)
	}
	port := freeRun(t, 1)
	r, err = a.Reserve(ctx, portalloc.Request{}, port)
	if !errors.Is(err, portalloc.ErrStoreUnavailable) || !errors.Is(err, statestore.ErrBusy) {
		t.Errorf("Reserve on a busy store = %+v, %v; want ErrStoreUnavailable wrapping ErrBusy", r, err)
	}
	if a.Backend() != portalloc.BackendStateStore || a.Stats().Fallbacks != 0 || log.count("state store unavailable") != 0 {
		t.Errorf("a busy store made the Allocator fall back: backend %s, %d fallbacks", a.Backend(), a.Stats().Fallbacks)
	}

	_ = locker.stdin.Close()
	_ = locker.cmd.Wait()
	if r, err := a.Reserve(ctx, portalloc.Request{}, port); err != nil || r.Backend != portalloc.BackendStateStore {
		t.Errorf("Reserve once the lock is free = %+v, %v; want it from the store", r, err)
	}
}

// TestFallbackSkipsTheAllocatorsOwnPorts: the store is replaced under an
// Allocator that holds a port in it, by a database a newer berth wrote
// that has no rows. The Allocator falls back; the store it can read now
// knows nothing of the Allocator's own port, and the MRU file never handed
// it out, but the Allocator still holds it: the MRU file must skip it too.
func TestFallbackSkipsTheAllocatorsOwnPorts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := freeRun(t, 2)
	log := &logCounter{}
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: portalloc.Range{First: base, Last: base + 1}, Logger: log.logger()})
	if err != nil {
		t.Fatal(err)
	}
	// Close cannot release the row in the replaced store; reaping
	// covers it, and its error is for logging.
	t.Cleanup(func() { _ = a.Close() })
	own, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil || own.Backend != portalloc.BackendStateStore {
		t.Fatalf("Allocate = %+v, %v; want a port from the store", own, err)
	}

	// An empty store of a newer schema, moved over the Allocator's.
	other := t.TempDir()
	s, err := statestore.Open(ctx, filepath.Join(other, "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	setSchemaVersion(t, other, statestore.SchemaVersion+1)
	for _, suffix := range []string{"-wal", "-shm"} { // the old file's, which would apply to the new one
		if err := os.Remove(filepath.Join(dir, "berth.db"+suffix)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := os.Rename(filepath.Join(other, "berth.db"), filepath.Join(dir, "berth.db")); err != nil {
		t.Fatal(err)
	}

	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil || r.Backend != portalloc.BackendMRU || r.Port == own.Port {
		t.Fatalf("Allocate after the store was replaced = %+v, %v; want the other port from the MRU file, not %d, which this Allocator holds", r, err, own.Port)
	}
	if r, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, portalloc.ErrRangeExhausted) {
		t.Fatalf("second Allocate = %+v, %v; want ErrRangeExhausted: one port is the Allocator's own, the other recently handed out", r, err)
	}
}
