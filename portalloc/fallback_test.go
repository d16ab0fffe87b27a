package portalloc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// The MRU file records nothing another process reads, so the fallback to
// it must never hand out a port a live berth holder keeps (every grant
// still takes the port's kernel lock), and must never be taken for a store
// that is merely busy.

// TestFallback: the database path is a directory. With fallback the MRU
// file serves, and the switch is logged once and counted; strict mode
// refuses; ModeMRU, chosen on purpose, serves without trying the store.
func TestFallback(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "berth.db"), 0o700); err != nil {
		t.Fatal(err)
	}
	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Logger: log.logger()})
	st := a.Stats()
	if st.Fallbacks != 1 || !strings.Contains(st.Fallback, "is a directory") {
		t.Errorf("Stats() = %+v; want one fallback, because berth.db is a directory", st)
	}
	seen := map[uint16]bool{}
	for range 5 {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Port] || !bindable(t, r) {
			t.Errorf("Allocate in the fallback = %+v; want a fresh bindable port", r)
		}
		seen[r.Port] = true
	}
	if n := log.count("state store unavailable"); n != 1 {
		t.Errorf("fallback logged %d times; want once. Log:\n%s", n, log.dump())
	}
	m := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeMRU, Logger: log.logger()})
	for range 5 {
		r, err := m.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Port] || !bindable(t, r) {
			t.Errorf("ModeMRU Allocate = %+v; want a port no other Allocator holds, bindable", r)
		}
		seen[r.Port] = true
	}
	if st := m.Stats(); st.Fallbacks != 0 || st.Fallback != "" {
		t.Errorf("ModeMRU Stats() = %+v; want no fallback: it serves from the MRU file by choice", st)
	}
	if n := log.count("state store unavailable"); n != 1 {
		t.Errorf("fallback logged %d times with ModeMRU's; want once", n)
	}
	if fi, err := os.Stat(filepath.Join(dir, "berth.db")); err != nil || !fi.IsDir() {
		t.Errorf("the directory in the way was changed: %v %v", fi, err)
	}

	_, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, IgnoreEnv: true})
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, store.ErrDamaged) {
		t.Errorf("New(strict) = %v; want ErrUnavailable wrapping ErrDamaged", err)
	}
	// A named holder's lease needs the store: the MRU file keeps none.
	if _, err := a.Allocate(ctx, portalloc.Request{Holder: "ci/x", TTL: time.Minute}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a holder's Allocate in the fallback = %v; want ErrUnavailable", err)
	}
	if _, err := a.AllocateBlock(ctx, portalloc.Request{}, 2); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("AllocateBlock in the fallback = %v; want ErrUnavailable", err)
	}
}

// TestFallbackSkipsPortsTheStoreHolds: another process holds a port in the
// store; then a newer berth upgrades the store's schema, so this berth
// cannot write to it and falls back. The MRU file must not hand out the
// held port, neither to Allocate in a range where it is the only other
// port nor to Reserve, though it is bindable (a reservation is not a
// bind): its lock is held. Nor when the store is garbage, nor in ModeMRU.
func TestFallbackSkipsPortsTheStoreHolds(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := freeRun(t, 2)
	held, other := base, base+1
	pid := holdInWorker(t, dir, lo4, held).cmd.Process.Pid
	setSchemaVersion(t, dir, statestore.SchemaVersion+1)

	log := &logCounter{}
	rng := store.Range{First: held, Last: other}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Range: rng, AllowEphemeralOverlap: true, Logger: log.logger()})
	if st := a.Stats(); st.Fallbacks != 1 || !strings.Contains(st.Fallback, store.ErrSchemaTooNew.Error()) {
		t.Fatalf("Allocator on a newer schema: Stats() = %+v; want a fallback because the schema is too new", st)
	}

	_, err := a.Reserve(ctx, portalloc.Request{}, held)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !slices.Contains(ce.PIDs, pid) {
		t.Errorf("Reserve(%d) in the fallback = %v; want ErrHeld naming pid %d, which holds its lock", held, err, pid)
	}
	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil || r.Port != other {
		t.Fatalf("Allocate in the fallback = %+v, %v; want port %d from the MRU file", r, err, other)
	}
	// other is now this process's, held is the worker's: nothing left.
	if r, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) {
		t.Fatalf("second Allocate in the fallback = %+v, %v; want ErrExhausted (port %d is held). Log:\n%s", r, err, held, log.dump())
	}

	// Garbage in place of the database: still nothing.
	if err := os.WriteFile(filepath.Join(dir, "garbage"), bytes.Repeat([]byte("not a database "), 300), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "garbage"), filepath.Join(dir, "berth.db")); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Allocate in the fallback with garbage for a store = %+v, %v; want ErrExhausted", r, err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, held); !errors.Is(err, store.ErrHeld) {
		t.Errorf("Reserve(%d) in the fallback with garbage for a store = %v; want ErrHeld", held, err)
	}
	// ModeMRU, which never reads the store, keeps clear of both too.
	m := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeMRU, Range: rng, AllowEphemeralOverlap: true, Logger: log.logger()})
	if r, err := m.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) {
		t.Fatalf("ModeMRU Allocate with both ports held = %+v, %v; want ErrExhausted", r, err)
	}
	if n := log.count("state store unavailable"); n != 1 {
		t.Errorf("the fallback was logged %d times; want once. Log:\n%s", n, log.dump())
	}
}

// TestFallbackRetriesTheStore: a fallback lasts until the store can be
// used again, not for the Allocator's life; the return is logged once.
func TestFallbackRetriesTheStore(t *testing.T) {
	t.Cleanup(portalloc.SetStoreRetryInterval(20 * time.Millisecond))
	ctx := context.Background()
	dir := t.TempDir()
	newerStore(t, dir)
	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Logger: log.logger()})
	if st := a.Stats(); st.Fallback == "" {
		t.Fatalf("Stats() = %+v; want a fallback", st)
	}
	setSchemaVersion(t, dir, statestore.SchemaVersion)
	deadline := time.Now().Add(10 * time.Second)
	var r store.Reservation
	for {
		var err error
		r, err = a.Allocate(ctx, portalloc.Request{Label: "retried"})
		if err != nil {
			t.Fatal(err)
		}
		if a.Stats().Fallback == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Allocator still serves from the MRU file 10s after the store was fixed: %+v", a.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rows := storeRows(t, dir, store.Filter{Port: r.Port}); len(rows) != 1 || rows[0].Label != "retried" {
		t.Errorf("rows of port %d, granted once the store was back = %v; want its row", r.Port, rows)
	}
	if n := log.count("usable again"); n != 1 {
		t.Errorf("the return to the store was logged %d times; want once. Log:\n%s", n, log.dump())
	}
}

// TestBusyStoreIsNotAFallback: another berth process holds the store's
// write lock past the timeout. The store is busy, not broken: Allocate and
// Reserve fail with ErrUnavailable wrapping ErrBusy, and the Allocator goes
// on with the store, which serves again once the lock is free.
func TestBusyStoreIsNotAFallback(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir}) // creates the store
	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Timeout: time.Second, Logger: log.logger()})
	locker := spawn(t, "flocker", "BERTH_STATE_DIR="+dir).ready(t)

	// The store's background sweep may be the one waiting for the lock
	// when a call comes, holding the store's turn: the call then runs out
	// of its time waiting behind it, which says so as well.
	busy := func(what string, r store.Reservation, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, store.ErrBusy) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on a busy store = %+v, %v; want ErrUnavailable wrapping ErrBusy or DeadlineExceeded", what, r, err)
		}
		if errors.Is(err, store.ErrDamaged) || errors.Is(err, store.ErrStorage) || errors.Is(err, store.ErrTransient) {
			t.Errorf("%s on a busy store = %v; want no damage, failure or shortage said", what, err)
		}
		if errors.Is(err, store.ErrBusy) && !strings.Contains(err.Error(), fmt.Sprint(locker.cmd.Process.Pid)) {
			t.Logf("the error does not name the lock's holder, pid %d: %v", locker.cmd.Process.Pid, err)
		}
	}
	r, err := a.Allocate(ctx, portalloc.Request{})
	busy("Allocate", r, err)
	port := freeRun(t, 1)
	r, err = a.Reserve(ctx, portalloc.Request{}, port)
	busy("Reserve", r, err)
	if st := a.Stats(); st.Fallback != "" || st.Fallbacks != 0 || log.count("state store unavailable") != 0 {
		t.Errorf("a busy store made the Allocator fall back: %+v", st)
	}

	_ = locker.stdin.Close()
	_ = locker.cmd.Wait()
	if r, err := a.Reserve(ctx, portalloc.Request{}, port); err != nil || len(storeRows(t, dir, store.Filter{Port: r.Port})) != 1 {
		t.Errorf("Reserve once the lock is free = %+v, %v; want it from the store", r, err)
	}
}

// TestFallbackSkipsTheAllocatorsOwnPorts: the store is replaced under an
// Allocator that holds a port in it, by a database a newer berth wrote
// that has no rows. The Allocator falls back; the store now knows nothing
// of the Allocator's own port, and the MRU file never handed it out, but
// the Allocator still holds it (and its lock): the MRU file must skip it
// too.
func TestFallbackSkipsTheAllocatorsOwnPorts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := freeRun(t, 2)
	log := &logCounter{}
	// Close cannot release the row in the replaced store; its error is for
	// logging.
	a := newOn(t, portalloc.Config{StateDir: dir, Range: store.Range{First: base, Last: base + 1}, AllowEphemeralOverlap: true, Logger: log.logger()})
	own, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil || a.Stats().Fallback != "" {
		t.Fatalf("Allocate = %+v, %v; want a port from the store", own, err)
	}

	// An empty store of a newer schema, moved over the Allocator's.
	other := t.TempDir()
	newerStore(t, other)
	for _, suffix := range []string{"-wal", "-shm"} { // the old file's, which would apply to the new one
		if err := os.Remove(filepath.Join(dir, "berth.db"+suffix)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := os.Rename(filepath.Join(other, "berth.db"), filepath.Join(dir, "berth.db")); err != nil {
		t.Fatal(err)
	}

	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil || r.Port == own.Port {
		t.Fatalf("Allocate after the store was replaced = %+v, %v; want the other port, not %d, which this Allocator holds", r, err, own.Port)
	}
	if st := a.Stats(); st.Fallback == "" || st.Fallbacks != 1 {
		t.Errorf("Stats() after the store was replaced by a newer one = %+v; want a fallback", st)
	}
	if r, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) {
		t.Fatalf("second Allocate = %+v, %v; want ErrExhausted: both ports are the Allocator's own", r, err)
	}
	if !holdsPort(a, own.Port) || !holdsPort(a, r.Port) {
		t.Errorf("Held() = %v; want both ports", a.Held())
	}
}
