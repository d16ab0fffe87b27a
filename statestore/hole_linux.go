package statestore

import (
	"os"

	"golang.org/x/sys/unix"
)

// hasHole reports whether f, of size bytes, has a hole before its end:
// a range of it that no write ever filled. SQLite writes every page of its
// file (berth never sets a chunk size, which could leave space unwritten),
// so a hole is a page lost to a truncation that a checkpoint then wrote
// around: the pages of the WAL written back at their offsets, and the file
// extended to its old length, over nothing. A file system that cannot
// tell (SEEK_HOLE answers the end of the file there) reports none.
func hasHole(f *os.File, size int64) bool {
	if f == nil || size <= 0 {
		return false
	}
	off, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
	return err == nil && off < size
}
