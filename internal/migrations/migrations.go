// Package migrations reads the versions of golang-migrate migration files,
// for the stores that embed them.
package migrations

import (
	"io/fs"
	"strconv"
	"strings"
)

// Latest returns the highest version among the migration files in dir of
// fsys, named VERSION_title.up.sql as golang-migrate names them; 0 when
// there are none. Files of another name are passed over.
func Latest(fsys fs.FS, dir string) uint {
	var latest uint
	entries, _ := fs.ReadDir(fsys, dir) // an unreadable dir has no versions
	for _, e := range entries {
		v, _, ok := strings.Cut(e.Name(), "_")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(v, 10, 32); err == nil && uint(n) > latest {
			latest = uint(n)
		}
	}
	return latest
}
