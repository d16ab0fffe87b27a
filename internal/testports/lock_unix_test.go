//go:build unix

package testports

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLock: while Lock holds a range, another open file description of its
// lock file cannot take the lock; after unlock it can.
func TestLock(t *testing.T) {
	r := Range{First: 1024, Last: 1024} // no package's: only its lock file is touched
	unlock, err := Lock(r)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(os.TempDir(), "berth-testports-"+r.String()+".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("flock while Lock holds %v = %v; want EWOULDBLOCK", r, err)
	}
	unlock()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock after unlock = %v; want nil", err)
	}
}
