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

	"github.com/berth-go/berth/store"
)

// TestWriterThatWaitedSeesTheFileReplaced: a write that was waiting for the
// write lock while the store's file was replaced under it (by the process
// that held the lock: a restore, or one that made the store anew) fails
// once it gets the lock with ErrLost, instead of writing into a file no
// other process reads any more.
func TestWriterThatWaitedSeesTheFileReplaced(t *testing.T) {
	ctx := context.Background()
	from := filepath.Join(t.TempDir(), "old", "berth.db")
	s := openAt(t, from)
	w := startWorker(t, "flockholder", from)
	w.until(t, "locked")
	done := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 24340)})
		done <- err
	}()
	waitForFlockWaiter(t, os.Getpid())
	// Replaced while the lock is held: the file at the path is no
	// longer the database the store opened.
	replaceWithEmpty(t, from)
	_ = w.stdin.Close() // lets the lock go
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrLost) {
			t.Errorf("Reserve that waited while the file was replaced = %v; want ErrLost: the store is to be opened again", err)
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
