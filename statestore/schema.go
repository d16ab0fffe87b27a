package statestore

import (
	"fmt"
	"io/fs"
	"sync"

	migfiles "github.com/berth-go/berth/internal/migrations"
)

// schema is what this berth knows of the schema.
type schema struct {
	src    fs.FS
	latest uint
	write  uint          // the write version of latest
	writes map[uint]uint // by migration version
}

// known returns the embedded schema, with a test's overlay (migfiles.SetOverlay).
func known() (schema, error) {
	src := migfiles.Source("statestore", migrations, "migrations")
	if src == fs.FS(migrations) {
		return ownSchema()
	}
	return readSchema(src)
}

// ownSchema is read once: every Open asks for it.
var ownSchema = sync.OnceValues(func() (schema, error) { return readSchema(migrations) })

func readSchema(src fs.FS) (schema, error) {
	latest := migfiles.Latest(src, "migrations")
	writes, err := migfiles.WriteVersions(src, "migrations")
	if err != nil {
		return schema{}, fmt.Errorf("statestore migrations: %w", err)
	}
	return schema{src: src, latest: latest, write: writes[latest], writes: writes}, nil
}

// ready reports whether a file in state f can be used as it is by a berth
// that knows k, and refuses a newer schema of an unknown write version, or
// whose migration was cut short (which only a newer berth can finish).
func (k schema) ready(path string, f fileState) (bool, error) {
	if f.version > k.latest && (f.dirty || !k.newerKnown(f)) {
		return true, tooNew(path, f, k)
	}
	return !f.fresh && !f.dirty && (f.version == k.latest || k.newerKnown(f)), nil
}

// newerKnown reports whether f's schema is newer than k's but of a write
// version k knows (never 0: every newer schema declares one).
func (k schema) newerKnown(f fileState) bool {
	return f.version > k.latest && f.writeVersion >= 1 && f.writeVersion <= k.write
}
