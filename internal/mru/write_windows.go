package mru

import (
	"os"
	"path/filepath"
)

// writeAtomic replaces the file at path with b: a temporary file in the same
// directory, synced, then renamed over path (MoveFileEx with
// MOVEFILE_REPLACE_EXISTING), since renameio does not support Windows.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
