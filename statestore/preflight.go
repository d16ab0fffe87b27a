package statestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berth-go/berth/internal/safefs"

	"github.com/berth-go/berth/store"
)

// ourTables are the tables a berth database may hold.
var ourTables = map[string]bool{
	"port_allocations":  true,
	"schema_history":    true,
	"sticky_ports":      true,
	"port_changes":      true, // the change journal of schema version 4
	"schema_migrations": true, // golang-migrate's version table
}

type fileState struct {
	fresh        bool          // no file, an empty one, or a SQLite file with no table yet
	version      uint          // golang-migrate's version; 0 before the first migration
	dirty        bool          // golang-migrate's flag: a migration did not finish
	writeVersion uint          // PRAGMA user_version; 0 before write versions
	applied      map[uint]bool // versions whose body committed (see schema_history)
}

// inspect decides, without writing a byte, whether path may be opened for
// writing and what it needs first. It reads through SQLite only: closing
// any other descriptor of the file would drop SQLite's locks of every Store
// of this process. SQLite refuses a file shorter than its header says
// (unless the WAL holds the missing pages), and rolls back a hot journal.
func inspect(ctx context.Context, path string, busy time.Duration) (fileState, error) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fileState{fresh: true}, nil
	case err != nil:
		return fileState{}, fmt.Errorf("%s: %w", path, err)
	case fi.IsDir():
		return fileState{}, fmt.Errorf("%s is a directory, not a database file; remove it or set another state directory: %w", path, store.ErrDamaged)
	case !fi.Mode().IsRegular():
		return fileState{}, fmt.Errorf("%s is not a regular file: %w", path, store.ErrDamaged)
	case fi.Size() == 0:
		return fileState{fresh: true}, nil
	}
	// No journal_mode here: setting it rewrites the header of a database
	// that is not ours.
	db, err := openDB(dsnBare(path) + fmt.Sprintf("?_pragma=busy_timeout(%d)", busy.Milliseconds()))
	if err != nil {
		return fileState{}, fmt.Errorf("%s: %w", path, err)
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(1)
	return inspectOn(ctx, path, db)
}

// querier is a *sql.DB or a *sql.Conn.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func inspectOn(ctx context.Context, path string, db querier) (fileState, error) {
	names, err := tableNames(ctx, db)
	if err != nil {
		return fileState{}, classify(path, err)
	}
	st := fileState{applied: map[uint]bool{}}
	if len(names) == 0 {
		st.fresh = true
		return st, nil
	}
	has := func(t string) bool { return slices.Contains(names, t) }
	if has("schema_migrations") {
		var v int64
		err := db.QueryRowContext(ctx, "SELECT version, dirty FROM schema_migrations LIMIT 1").Scan(&v, &st.dirty)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return fileState{}, classify(path, err)
		case v > 0:
			st.version = uint(v)
		}
	}
	// A table berth does not know is another program's, unless a newer
	// berth made it: a newer schema in a store with berth's own tables,
	// which this berth may write to if its write version says so.
	if st.version <= SchemaVersion || !has("port_allocations") {
		for _, name := range names {
			if !ourTables[name] {
				return fileState{}, fmt.Errorf("%s is a SQLite database of another program (it has table %q); choose another path: %w", path, name, store.ErrDamaged)
			}
		}
	}
	var w int64
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&w); err != nil {
		return fileState{}, classify(path, err)
	}
	if w > 0 {
		st.writeVersion = uint(w)
	}
	if has("schema_history") {
		applied, err := column[int64](ctx, db, "SELECT version FROM schema_history")
		if err != nil {
			return fileState{}, classify(path, err)
		}
		for _, v := range applied {
			if v > 0 {
				st.applied[uint(v)] = true
			}
		}
	}
	return st, nil
}

func tableNames(ctx context.Context, db querier) ([]string, error) {
	return column[string](ctx, db, "SELECT name FROM sqlite_schema WHERE type = 'table'")
}

func column[T any](ctx context.Context, db querier, q string) ([]T, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// classify turns an error of reading the file into store.ErrDamaged,
// ErrBusy, ErrTransient or ErrStorage.
func classify(path string, err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_NOTADB:
			return fmt.Errorf("%s is not a SQLite database (or its header is damaged); move it aside to start a new store (berth never overwrites it): %w", path, store.ErrDamaged)
		case sqlite3.SQLITE_CORRUPT:
			return fmt.Errorf("%s is damaged or truncated (%s); move it aside to start a new store (berth never overwrites it): %w", path, se.Error(), store.ErrDamaged)
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("%s is locked by another process (%w): %w", path, err, store.ErrBusy)
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", path, err)
	}
	if short := shortage(err, filepath.Dir(path)); short != nil {
		return fmt.Errorf("open %s: %w", path, short)
	}
	return storageErr("open "+path, err)
}

// pageSize is the page size of new databases. Rows are small and every
// commit writes whole pages to the WAL, so small pages make commits cheaper.
const pageSize = 1024

// initFile makes path a new, empty database in WAL mode, mode 0600 (SQLite
// gives the -wal and -shm files the same). A crash leaves a file that
// inspect finds fresh again.
func initFile(ctx context.Context, path string, busy time.Duration) error {
	f, err := safefs.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if errors.Is(err, safefs.ErrUnsafe) {
		return err
	}
	if err != nil {
		return storageErr("create "+path, err)
	}
	if err := f.Close(); err != nil {
		return storageErr("create "+path, err)
	}
	db, err := openDB(dsnBare(path) + fmt.Sprintf("?_pragma=busy_timeout(%d)&_pragma=page_size(%d)", busy.Milliseconds(), pageSize))
	if err != nil {
		return storageErr("create "+path, err)
	}
	defer func() { _ = db.Close() }()
	if _, err := db.ExecContext(ctx, "PRAGMA journal_mode=WAL"); err != nil {
		return classify(path, err)
	}
	return nil
}
