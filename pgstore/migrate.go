package pgstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	migfiles "github.com/berth-go/berth/internal/migrations"
	"github.com/berth-go/berth/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// SchemaVersion is the schema version this berth writes.
var SchemaVersion = migfiles.Latest(migrations, "migrations")

// migrationsTable is golang-migrate's version table: not its default
// name, which every program that uses golang-migrate shares.
const migrationsTable = "berth_schema_migrations"

// schemaVersion reads the database's berth schema version: 0 for none.
func schemaVersion(ctx context.Context, conn *pgx.Conn) (v uint, dirty bool, err error) {
	var n int64
	err = conn.QueryRow(ctx, "SELECT version, dirty FROM "+migrationsTable+" LIMIT 1").Scan(&n, &dirty)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable, errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	case n < 0:
		return 0, dirty, nil
	}
	return uint(n), dirty, nil
}

func tooNew(v uint) error {
	return fmt.Errorf("open: the database has berth schema version %d, this berth knows up to %d; upgrade berth or use another database: %w", v, SchemaVersion, store.ErrSchemaTooNew)
}

// migrateUp brings the berth schema of the database cfg names to
// SchemaVersion. A current database costs one query and takes no lock.
// Otherwise golang-migrate applies the embedded migrations under a session
// advisory lock, waited for at most timeout (at least a minute) or until
// ctx ends.
//
// golang-migrate marks a version dirty while it runs its body. PostgreSQL
// runs each body as one transaction that also records itself in
// berth_schema_history, so a dirty mark left by a crash is resolved from
// that table: the body committed or left no trace.
func migrateUp(ctx context.Context, cfg *pgx.ConnConfig, timeout time.Duration, log logr.Logger, name string) error {
	wait := max(timeout, time.Minute)
	if d, ok := ctx.Deadline(); ok {
		wait = time.Until(d)
	}
	rctx, rcancel := context.WithTimeout(ctx, timeout)
	conn, err := pgx.ConnectConfig(rctx, cfg)
	if err != nil {
		rcancel()
		return migrateErr(ctx, "open: connect to "+name, timeout, err)
	}
	v, dirty, err := schemaVersion(rctx, conn)
	rcancel()
	_ = conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return migrateErr(ctx, "open: read the schema version of "+name, timeout, err)
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if v > SchemaVersion {
		return tooNew(v)
	}
	if v == SchemaVersion && !dirty {
		return nil
	}

	mcfg := cfg.Copy()
	if mcfg.RuntimeParams == nil {
		mcfg.RuntimeParams = map[string]string{}
	}
	// pg_advisory_lock takes no context; lock_timeout ends its wait.
	mcfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
	db := stdlib.OpenDB(*mcfg)
	drv, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{MigrationsTable: migrationsTable})
	if err != nil {
		_ = db.Close()
		return migrateErr(ctx, "open: migrate "+name, wait, err)
	}
	src, err := iofs.New(migrations, "migrations")
	if err != nil {
		_ = drv.Close()
		return fmt.Errorf("open: migrate: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		_ = src.Close()
		_ = drv.Close()
		return migrateErr(ctx, "open: migrate "+name, wait, err)
	}
	m.LockTimeout = wait
	defer func() { _, _ = m.Close() }()

	if dirty {
		if err := resolveDirty(cctx, db, drv, src, log); err != nil {
			return migrateErr(ctx, "open: migrate "+name, wait, err)
		}
	}
	err = m.Up()
	var de migrate.ErrDirty
	if errors.As(err, &de) {
		// A berth that was migrating died while this one waited for the
		// lock: resolve its mark, under the lock, and go on.
		if err := resolveDirty(cctx, db, drv, src, log); err != nil {
			return migrateErr(ctx, "open: migrate "+name, wait, err)
		}
		err = m.Up()
	}
	if err == nil || errors.Is(err, migrate.ErrNoChange) {
		if err == nil {
			log.Info("migrated berth's PostgreSQL schema", "to", SchemaVersion)
		}
		return nil
	}
	// Another berth, a newer one, may have migrated past this one's
	// versions while this one waited for the lock.
	if now, _, verr := m.Version(); verr == nil && now > SchemaVersion {
		return tooNew(now)
	}
	return migrateErr(ctx, "open: migrate "+name, wait, err)
}

// resolveDirty clears golang-migrate's dirty mark, if there still is one
// once it holds the migration lock: the marked version stays when its body
// committed, else the version before it does. Under the lock, a migration
// another berth is running right now is never taken for one cut short.
func resolveDirty(ctx context.Context, db *sql.DB, drv database.Driver, src source.Driver, log logr.Logger) (err error) {
	if err := drv.Lock(); err != nil {
		return err
	}
	defer func() {
		if uerr := drv.Unlock(); err == nil {
			err = uerr
		}
	}()
	cur, dirty, err := drv.Version()
	if err != nil || !dirty || cur < 0 {
		return err
	}
	v := uint(cur)
	var applied bool
	err = db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM berth_schema_history WHERE version = $1)", int64(v)).Scan(&applied)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
		err = nil // no history: the body left no trace
	}
	if err != nil {
		return err
	}
	to := int(v)
	if !applied {
		to = database.NilVersion
		if prev, err := src.Prev(v); err == nil {
			to = int(prev)
		}
	}
	log.Info("resolving a migration cut short", "version", v, "now", to)
	return drv.SetVersion(to, false)
}

// migrateErr wraps a migration's error: the context's error when ctx ended, else one
// wrapping store.ErrStorage, which says when the server did not answer within limit.
func migrateErr(ctx context.Context, op string, limit time.Duration, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", op, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w: the server did not answer within %v", op, store.ErrStorage, limit)
	}
	return fmt.Errorf("%s: %w: %w", op, store.ErrStorage, err)
}
