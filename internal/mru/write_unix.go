//go:build !windows

package mru

import "github.com/google/renameio/v2"

// writeAtomic replaces the file at path with b (mode 0600): readers see the
// old file or the new one, never a part.
func writeAtomic(path string, b []byte) error {
	return renameio.WriteFile(path, b, 0o600)
}
