package filelock_test

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/berth-go/berth/internal/filelock"
)

// TestHolderAmidLockTraffic: the holder of a lock is found even while
// other locks are taken and let go all the time, which shifts the lines of
// /proc/locks between the pieces it is read in (one read in a few hundred
// missed the holder, before it was read again).
func TestHolderAmidLockTraffic(t *testing.T) {
	dir := t.TempDir()
	held, err := filelock.Open(filepath.Join(dir, "held.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := held.Lock(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		l, err := filelock.Open(filepath.Join(dir, "churn"+strconv.Itoa(i)+".lock"))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer l.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := l.Lock(); err == nil {
					_ = l.Unlock()
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	misses := 0
	const tries = 2000
	for range tries {
		h, ok := filelock.HolderOf(held.Path())
		if !ok || h.PID != os.Getpid() {
			misses++
		}
	}
	if misses > 0 {
		t.Errorf("HolderOf missed this process's lock %d times in %d amid other locks' traffic; want 0", misses, tries)
	}
}
