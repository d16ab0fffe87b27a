package statestore

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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

// TestPlaceChangedWhenDirectoryMadeAgainWithItsInode: a directory removed
// and made again often gets the inode number of the one removed (ext4 hands
// a freed inode out again at once), so the same device and inode do not
// make it the same directory. Its modification time does tell them apart.
func TestPlaceChangedWhenDirectoryMadeAgainWithItsInode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "berth.db")
	for range 1000 {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		before := placeOf(path)
		time.Sleep(10 * time.Millisecond) // past the file system's clock tick
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		now := placeOf(path)
		if os.SameFile(before.dir, now.dir) {
			if !before.changed(now) {
				t.Error("a directory removed and made again with the same inode number counts as no change; want a change, so that Open tries again")
			}
			return
		}
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	t.Skip("this file system gave the directory made again another inode number each time: nothing to tell apart")
}
