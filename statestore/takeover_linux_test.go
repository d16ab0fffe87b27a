package statestore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/statestore"
)

// TestTakeOverWaitsForTheWriteLock: while another process holds the old
// store's write lock, TakeOver waits, and gives up with ErrBusy naming the
// holder when it is held too long; nothing moves.
func TestTakeOverWaitsForTheWriteLock(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	from := filepath.Join(base, "old", "berth.db")
	to := filepath.Join(base, "new", "berth.db")
	openAt(t, from)
	w := startWorker(t, "flockholder", from)
	w.until(t, "locked")
	moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{BusyTimeout: 200 * time.Millisecond})
	if moved || !errors.Is(err, statestore.ErrBusy) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(w.cmd.Process.Pid)) {
		t.Errorf("TakeOver while pid %d holds the write lock = %v, %v; want ErrBusy naming it", w.cmd.Process.Pid, moved, err)
	}
	if _, err := os.Stat(to); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists after a take-over that gave up (%v)", to, err)
	}
	_ = w.stdin.Close() // lets the lock go
	_ = w.cmd.Wait()
	if moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{}); err != nil || !moved {
		t.Errorf("TakeOver once the lock is free = %v, %v; want true, nil", moved, err)
	}
}

// TestWriterThatWaitedSeesTheMove: a write that was waiting for the write
// lock while the store was moved away under it (as TakeOver does, holding
// that lock) fails once it gets the lock with ErrLost, instead of
// writing into a file no other process reads any more.
func TestWriterThatWaitedSeesTheMove(t *testing.T) {
	ctx := context.Background()
	from := filepath.Join(t.TempDir(), "old", "berth.db")
	s := openAt(t, from)
	w := startWorker(t, "flockholder", from)
	w.until(t, "locked")
	done := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24340)})
		done <- err
	}()
	waitForFlockWaiter(t, os.Getpid())
	// What TakeOver does with the lock held: the file at the path is no
	// longer the database the store opened.
	if err := os.WriteFile(from+".note", []byte("moved\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(from+".note", from); err != nil {
		t.Fatal(err)
	}
	_ = w.stdin.Close() // lets the lock go
	select {
	case err := <-done:
		if !errors.Is(err, statestore.ErrLost) {
			t.Errorf("Reserve that waited while the store moved = %v; want ErrLost: the store is to be opened again", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Reserve still waiting 10s after the lock was let go")
	}
}

// waitForFlockWaiter polls /proc/locks until process pid waits for a
// flock ("->" marks a blocked request).
func waitForFlockWaiter(tb testing.TB, pid int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("/proc/locks")
		if err != nil {
			tb.Skipf("cannot read /proc/locks: %v", err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) > 5 && f[1] == "->" && f[2] == "FLOCK" && f[5] == strconv.Itoa(pid) {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pid %d did not wait for the write lock within 10s", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
