package statestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/berth-go/berth/store"
)

// sameFile fails, with an error wrapping store.ErrLost, when the database
// file at the store's path, or its WAL, is no longer the one it opened:
// deleted, replaced, or truncated (berth never shrinks its file: it never
// vacuums). Writing on would put reservations where no other process looks.
func (s *sqlStore) sameFile() error {
	fi, err := os.Stat(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("database file %s is gone: %w", s.path, store.ErrLost)
	case err != nil:
		return storageErr("stat "+s.path, err)
	case !os.SameFile(fi, s.file):
		return fmt.Errorf("database file %s was replaced since the store opened it: %w", s.path, store.ErrLost)
	case s.wal != nil && !os.SameFile(s.wal, stat(s.path+"-wal")):
		return fmt.Errorf("the write-ahead log %s-wal was removed or replaced since the store opened it: %w", s.path, store.ErrLost)
	case fi.Size() < s.size.Load():
		return fmt.Errorf("database file %s was truncated since the store opened it (%d bytes, %d before): %w", s.path, fi.Size(), s.size.Load(), store.ErrLost)
	}
	if n := fi.Size(); n > s.size.Load() {
		s.size.Store(n) // one writer at a time grows it; a lost race only delays noticing
	}
	return nil
}

func (s *sqlStore) Check(context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return s.sameFile()
}
