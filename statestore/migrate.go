package statestore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/gofrs/flock"
	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/berth-go/berth/internal/filelock"
)

//go:embed migrations/*.sql
var migrations embed.FS

// SchemaVersion is the schema version this berth writes.
var SchemaVersion = latestMigration()

func latestMigration() uint {
	var latest uint
	entries, _ := fs.ReadDir(migrations, "migrations") // embedded: cannot fail
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

// prepareFile checks the file at path and brings its schema to
// SchemaVersion, exactly once however many processes open a fresh file
// together, and reports the version it found (0 for a new file). A file that
// is current, the common case, costs one read and no lock. Otherwise a flock
// on a sidecar file serialises the processes from a second look at the file
// to the last migration (golang-migrate's sqlite driver locks only within
// one process); the database file itself is never locked by anything but
// SQLite, because closing any descriptor of it drops SQLite's own locks.
// Every wait ends with ctx or after busy, with an error wrapping ErrBusy.
func prepareFile(ctx context.Context, path string, busy time.Duration, log logr.Logger) (uint, error) {
	st, err := inspect(ctx, path, busy)
	if err != nil {
		return 0, err
	}
	if st.version > SchemaVersion {
		return st.version, tooNew(path, st.version)
	}
	if st.current() {
		return st.version, nil
	}
	lock := flock.New(path+".migrate.lock", flock.SetPermissions(0o600))
	defer func() { _ = lock.Close() }()
	lctx, cancel := context.WithTimeout(ctx, busy)
	defer cancel()
	ok, err := lock.TryLockContext(lctx, 5*time.Millisecond)
	if !ok || err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("statestore: migration lock %s: %w", lock.Path(), ctx.Err())
		}
		holder := "another process"
		if h, found := filelock.HolderOf(lock.Path()); found {
			holder = h.String()
		}
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			return 0, fmt.Errorf("statestore: migration lock %s is held by %s (waited %v): %w", lock.Path(), holder, busy, ErrBusy)
		}
		return 0, storageErr("migration lock "+lock.Path(), err)
	}
	defer func() { _ = lock.Unlock() }()
	// Another process may have done the work while this one waited.
	if st, err = inspect(ctx, path, busy); err != nil {
		return 0, err
	}
	if st.fresh {
		if err := initFile(ctx, path, busy); err != nil {
			return 0, err
		}
	}
	if st.version > SchemaVersion {
		return st.version, tooNew(path, st.version)
	}
	if st.current() {
		return st.version, nil
	}
	return st.version, migrateUp(ctx, path, st, busy, log)
}

func tooNew(path string, v uint) error {
	return fmt.Errorf("statestore: %s has schema version %d, this berth knows up to %d; upgrade berth or use another state directory: %w", path, v, SchemaVersion, ErrSchemaTooNew)
}

// migrateUp applies the embedded migrations. The caller holds the migration
// lock.
//
// golang-migrate marks a version dirty, runs the migration's body in a
// transaction, then marks it clean; a crash between those steps leaves
// "dirty", which golang-migrate refuses for good. Each body of berth's
// migrations records itself in schema_history and writes its own clean
// version in its transaction, so a dirty mark tells exactly one thing: the
// body of that version either committed (schema_history has it) or left no
// trace. migrateUp resolves the mark accordingly and goes on.
func migrateUp(ctx context.Context, path string, st fileState, busy time.Duration, log logr.Logger) error {
	// migrate gets a *sql.DB of its own: its Close closes it.
	db, err := sql.Open("sqlite", dsn(path, busy, false))
	if err != nil {
		return storageErr("migrate "+path, err)
	}
	drv, err := sqlite.WithInstance(db, &sqlite.Config{})
	if err != nil {
		_ = db.Close()
		return classify(path, err)
	}
	src, err := iofs.New(migrations, "migrations")
	if err != nil {
		_ = drv.Close()
		return fmt.Errorf("statestore: migrate %s: %w", path, err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "sqlite", drv)
	if err != nil {
		_ = src.Close()
		_ = drv.Close()
		return classify(path, err)
	}
	defer func() { _, _ = m.Close() }()
	from := st.version
	if st.dirty {
		to := int(st.version) // the body committed: the version stands
		if !st.applied[st.version] {
			to = int(st.version) - 1 // it left no trace: back to the one before
			if to == 0 {
				to = database.NilVersion
			}
		}
		log.Info("resolving a migration cut short", "path", path, "version", st.version, "now", to)
		if err := m.Force(to); err != nil {
			return classify(path, err)
		}
		from = uint(max(to, 0))
	}
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("statestore: migrate %s from version %d: %w", path, from, classify(path, err))
	}
	log.Info("migrated state store", "path", path, "from", from, "to", SchemaVersion)
	return nil
}
