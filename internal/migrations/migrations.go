// Package migrations reads the versions of golang-migrate migration files,
// and the write versions they declare, for the stores that embed them.
package migrations

import (
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Latest returns the highest version among the up migration files in dir
// of fsys, named VERSION_title.up.sql as golang-migrate names them; 0 when
// there are none. Files of another name are passed over.
func Latest(fsys fs.FS, dir string) uint {
	files, _ := upFiles(fsys, dir) // an unreadable dir has no versions
	return slices.Max(append(slices.Collect(maps.Keys(files)), 0))
}

// upFiles returns the names of the up migration files in dir of fsys, by
// version.
func upFiles(fsys fs.FS, dir string) (map[uint]string, error) {
	entries, err := fs.ReadDir(fsys, dir)
	files := map[uint]string{}
	for _, e := range entries {
		v, rest, ok := strings.Cut(e.Name(), "_")
		if !ok || !strings.HasSuffix(rest, ".up.sql") {
			continue
		}
		if n, err := strconv.ParseUint(v, 10, 32); err == nil {
			files[uint(n)] = e.Name()
		}
	}
	return files, err
}

// Compat is the first migration version that declares a write version: a
// migration from Compat on has a line "-- write-version: N" in its up file.
// Before it, stores had no write version (0), and every berth refused a
// schema newer than it knew.
const Compat = 6

// Declaration is the comment line, followed by a number, by which an up
// migration declares the write version of the schema it makes.
const Declaration = "-- write-version:"

// WriteVersions returns the write version each up migration in dir of
// fsys declares, by version (see Declaration). A migration before Compat
// declares none and counts as 0. Every migration from Compat on must
// declare one, equal to its predecessor's (older writers tolerate the
// change) or one more (they must stop writing): anything else is an error
// naming the file.
func WriteVersions(fsys fs.FS, dir string) (map[uint]uint, error) {
	files, err := upFiles(fsys, dir)
	if err != nil {
		return nil, err
	}
	out := map[uint]uint{}
	var prev uint
	for _, v := range slices.Sorted(maps.Keys(files)) {
		if v < Compat {
			out[v] = 0
			continue
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, files[v]))
		if err != nil {
			return nil, err
		}
		w, ok := declared(string(body))
		switch {
		case !ok:
			return nil, fmt.Errorf("migration %s declares no write version: want a line %q N", files[v], Declaration)
		case w == 0 || (prev != 0 && w != prev && w != prev+1):
			return nil, fmt.Errorf("migration %s declares write version %d after %d: want %d (older writers tolerate it) or %d (they must stop writing)", files[v], w, prev, max(prev, 1), prev+1)
		}
		out[v], prev = w, w
	}
	return out, nil
}

// declared finds the write version a migration body declares.
func declared(body string) (uint, bool) {
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), Declaration)
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(rest), 10, 32)
		if err != nil {
			return 0, false
		}
		return uint(n), true
	}
	return 0, false
}

// overlays are migrations that tests add after a store's own, by the
// store's name; see SetOverlay. Guarded by mu.
var (
	mu       sync.Mutex
	overlays = map[string]fs.FS{}
)

// SetOverlay adds, for tests only, the migration files in the directory
// dir of extra to the migrations of the store called name (e.g.
// "statestore"), as if a newer berth had them: a test process can then
// play a newer build on a shared store. nil removes the overlay. berth
// itself never calls it; a test calls it before the store is opened.
func SetOverlay(name string, extra fs.FS) {
	mu.Lock()
	defer mu.Unlock()
	if extra == nil {
		delete(overlays, name)
		return
	}
	overlays[name] = extra
}

// Source returns the migrations of the store called name: the directory
// dir of own, with any overlay's files (from its directory dir) added.
func Source(name string, own fs.FS, dir string) fs.FS {
	mu.Lock()
	extra := overlays[name]
	mu.Unlock()
	if extra == nil {
		return own
	}
	return merged{own, extra, dir}
}

// merged reads dir from two file systems, the second's files added to the
// first's.
type merged struct {
	a, b fs.FS
	dir  string
}

func (m merged) Open(name string) (fs.File, error) {
	if f, err := m.a.Open(name); err == nil || name == m.dir || name == "." {
		return f, err
	}
	return m.b.Open(name)
}

func (m merged) ReadDir(name string) ([]fs.DirEntry, error) {
	a, err := fs.ReadDir(m.a, name)
	if err != nil {
		return nil, err
	}
	if name != m.dir {
		return a, nil
	}
	b, err := fs.ReadDir(m.b, name)
	if err != nil {
		return nil, err
	}
	out := append(slices.Clone(a), b...)
	slices.SortFunc(out, func(x, y fs.DirEntry) int { return strings.Compare(x.Name(), y.Name()) })
	return out, nil
}
