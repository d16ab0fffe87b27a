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
