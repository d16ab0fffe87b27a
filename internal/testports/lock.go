package testports

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Lock waits until no other process on this host holds r, then holds it
// until unlock is called or the process exits. The ranges keep the packages
// of one go test ./... apart; Lock keeps two runs at once apart too (say,
// two developers' on one machine), which would otherwise share every range:
// a package's second test binary waits for the first instead of racing it
// for the same ports. A program that binds ports across these ranges while
// tests may run, such as a long torture run over 20000-32767, can take Lock
// for each range of All it overlaps, in the order of All. Where flock is not
// available Lock returns at once.
func Lock(r Range) (unlock func(), err error) {
	path := filepath.Join(os.TempDir(), "berth-testports-"+r.String()+".lock")
	// Read-only is enough for flock, and lets another user's run share a
	// file the first one created.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("testports: lock %v: %w", r, err)
	}
	// A test binary that waits here says so: if it times out, its output
	// names the lock.
	waiting := func() {
		fmt.Fprintf(os.Stderr, "testports: waiting for %v: another process on this host holds %s\n", r, path)
	}
	if err := lockFile(f, waiting); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("testports: lock %v: %w", r, err)
	}
	return func() { _ = f.Close() }, nil // closing the file drops the lock
}

// Hold is Lock for one test: it holds r until tb ends.
func Hold(tb testing.TB, r Range) {
	tb.Helper()
	unlock, err := Lock(r)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(unlock)
}
