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
	"github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source/iofs"
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
// together. golang-migrate's sqlite driver locks only within one process, so
// a flock on a sidecar file serialises the processes, from the first look at
// the file to the last migration; the database file itself is never locked
// by anything but SQLite, because closing any descriptor of it drops
// SQLite's own locks.
func prepareFile(ctx context.Context, path string, log logr.Logger) error {
	lock := flock.New(path+".migrate.lock", flock.SetPermissions(0o600))
	defer func() { _ = lock.Close() }()
	ok, err := lock.TryLockContext(ctx, 5*time.Millisecond)
	if err != nil {
		return fmt.Errorf("statestore: migration lock %s: %w", lock.Path(), err)
	}
	if !ok {
		return fmt.Errorf("statestore: migration lock %s: %w", lock.Path(), ctx.Err())
	}
	defer func() { _ = lock.Unlock() }()
	if err := preflight(ctx, path); err != nil {
		return err
	}
	return migrateUp(ctx, path, log)
}

// migrateUp applies the embedded migrations. The caller holds the migration
// lock.
func migrateUp(ctx context.Context, path string, log logr.Logger) error {

	// migrate gets a *sql.DB of its own: its Close closes it.
	db, err := sql.Open("sqlite", dsn(path, 5*time.Second, false))
	if err != nil {
		return fmt.Errorf("statestore: migrate %s: %w", path, err)
	}
	drv, err := sqlite.WithInstance(db, &sqlite.Config{})
	if err != nil {
		_ = db.Close()
		return fmt.Errorf("statestore: migrate %s: %w", path, err)
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
		return fmt.Errorf("statestore: migrate %s: %w", path, err)
	}
	defer func() { _, _ = m.Close() }()

	v, dirty, err := m.Version()
	switch {
	case errors.Is(err, migrate.ErrNilVersion):
		v = 0
	case err != nil:
		return fmt.Errorf("statestore: read schema version of %s: %w", path, err)
	}
	if v > SchemaVersion {
		return fmt.Errorf("statestore: %s has schema version %d, this berth knows up to %d; upgrade berth or use another state directory: %w", path, v, SchemaVersion, ErrSchemaTooNew)
	}
	if dirty {
		return fmt.Errorf("statestore: %s: migration to version %d did not finish; move the file aside to start a new store: %w", path, v, ErrDamaged)
	}
	if v == SchemaVersion {
		return nil
	}
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("statestore: migrate %s from version %d: %w", path, v, err)
	}
	log.Info("migrated state store", "path", path, "from", v, "to", SchemaVersion)
	return nil
}
