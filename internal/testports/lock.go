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
// two developers' on one machine), which would otherwise share every range: a package's second test binary waits for the first
// instead of racing it for the same ports. Where flock is not available
// Lock returns at once.
func Lock(r Range) (unlock func(), err error) {
	path := filepath.Join(os.TempDir(), "berth-testports-"+r.String()+".lock")
	// Read-only is enough for flock, and lets another user's run share a
	// file the first one created.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("testports: lock %v: %w", r, err)
	}
	if err := lockFile(f); err != nil {
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
