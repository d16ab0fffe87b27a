package statestore

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPlaceChangedWhenDirectoryMadeAndRemoved: an open that finds the
// store's directory missing makes it; a cleaner that removes it again before
// SQLite opens the file leaves it missing before and after, which Open must
// take for a store lost while it opened (to open again), not for a failure.
// A directory and a file that stayed put are no change.
func TestPlaceChangedWhenDirectoryMadeAndRemoved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	before := placeOf(path)
	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	if !before.changed(placeOf(path)) {
		t.Error("a directory made and removed again while the store opened counts as no change; want a change, so that Open tries again")
	}

	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if stayed := placeOf(path); stayed.changed(placeOf(path)) {
		t.Error("a directory and a file that stayed put count as a change; want none")
	}
}
