package statestore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/gofrs/flock"
	"github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/berth-go/berth/internal/filelock"
	migfiles "github.com/berth-go/berth/internal/migrations"

	"github.com/berth-go/berth/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// SchemaVersion is the schema version this berth migrates a store to. A
// store of a newer schema is used as it is when its write version is one
// this berth knows (see WriteVersion and the package doc).
var SchemaVersion = migfiles.Latest(migrations, "migrations")

// WriteVersion is the write version of SchemaVersion: this berth writes, with
// its full guarantee, to every store whose write version is at most
// WriteVersion, whatever its schema version; a higher one makes Open refuse
// the store with store.ErrSchemaTooNew.
var WriteVersion = func() uint {
	k, _ := ownSchema() // on an error, 0: TestWriteVersionsDeclared names the file
	return k.write
}()

// prepareFile brings the file at path to SchemaVersion, once however many
// processes open it together, and reports the version it found (0: new). A
// current file costs one read and no lock; otherwise a flock of a sidecar
// file serialises the processes (never a lock of the database file:
// closing any descriptor of it drops SQLite's own locks).
func prepareFile(ctx context.Context, path string, busy time.Duration, log logr.Logger) (uint, error) {
	k, err := known()
	if err != nil {
		return 0, err
	}
	st, err := inspect(ctx, path, busy)
	if err != nil && !unreadable(err) {
		return 0, err
	} else if ready, rerr := k.ready(path, st); err == nil && (ready || rerr != nil) {
		return st.version, rerr
	}
	lock := flock.New(path+".migrate.lock", flock.SetPermissions(0o600))
	defer func() { _ = lock.Close() }() // Close unlocks
	lctx, cancel := context.WithTimeout(ctx, busy)
	defer cancel()
	ok, err := lock.TryLockContext(lctx, 5*time.Millisecond)
	if !ok || err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("migration lock %s: %w", lock.Path(), ctx.Err())
		}
		holder := "another process"
		if h, found := filelock.HolderOf(lock.Path()); found {
			holder = h.String()
		}
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			return 0, fmt.Errorf("migration lock %s is held by %s (waited %v): %w", lock.Path(), holder, busy, store.ErrBusy)
		}
		return 0, storageErr("migration lock "+lock.Path(), err)
	}
	// A lock of a directory that was removed (or a lock file that was
	// replaced) while this process waited serialises nothing: another
	// process may hold the lock of the new one and migrate the same file.
	if held, err := lock.Stat(); err != nil || !sameAsPath(held, lock.Path()) {
		return 0, fmt.Errorf("migration lock %s was removed or replaced while this process waited for it: %w", lock.Path(), store.ErrLost)
	}
	// Another process may have done the work while this one waited.
	if st, err = inspect(ctx, path, busy); unreadable(err) {
		st = fileState{fresh: true} // set aside and made again, as an emptied file
	} else if err != nil {
		return 0, err
	}
	if st.fresh {
		if aside, err := setAsideLost(path, time.Now()); err != nil {
			return 0, err
		} else if aside {
			log.Info("the database file was emptied (truncated, or left with no table) or its WAL removed; set it aside with its WAL and made a new one", "path", path)
		}
		return st.version, makeFresh(ctx, path, st, k, busy, log)
	}
	if ready, err := k.ready(path, st); ready || err != nil {
		return st.version, err
	}
	return st.version, migrateUp(ctx, path, st, k, busy, log)
}

// makeFresh makes the database at path in a file of its own beside it,
// put in place only once migrated and checkpointed, so a failure (a
// shortage of descriptors, a crash) leaves no half-made file at path. A
// directory removed meanwhile leaves each process the lock of a file that
// is gone, so two may make the store at once: each puts its file in place
// only where no file is yet, and never one that is not the one it made.
func makeFresh(ctx context.Context, path string, st fileState, k schema, busy time.Duration, log logr.Logger) error {
	removeStaleFresh(path)
	tmp := path + freshSuffix + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(rand.Uint64(), 36)
	defer removeDBFiles(tmp) // once placed, the file keeps its other name
	var made os.FileInfo
	// lost wraps store.ErrLost, on which Open starts again, into the failure
	// of a step when the file was removed or replaced meanwhile.
	lost := func(err error) error {
		if fi, serr := os.Stat(tmp); serr != nil || (made != nil && !os.SameFile(fi, made)) {
			return fmt.Errorf("create %s: the new file was removed or replaced while it was made (%w): %w", path, err, store.ErrLost)
		}
		return err
	}
	if err := initFile(ctx, tmp, busy); err != nil {
		return lost(err)
	}
	made, err := os.Stat(tmp)
	if err != nil {
		return lost(storageErr("create "+tmp, err))
	}
	if err := migrateUp(ctx, tmp, st, k, busy, log); err != nil {
		return lost(err)
	}
	if err := checkpointAll(ctx, tmp, busy); err != nil {
		return lost(err)
	}
	if fi, err := os.Stat(tmp); err != nil || !os.SameFile(fi, made) {
		return fmt.Errorf("create %s: the new file was removed or replaced while it was made: %w", path, store.ErrLost)
	}
	return placeNew(tmp, path)
}

// placeNew names tmp path, unless another process made a store there first.
func placeNew(tmp, path string) error {
	switch err := os.Link(tmp, path); {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("create %s: the new file was removed while it was made: %w", path, store.ErrLost)
	case errors.Is(err, fs.ErrExist):
		if fi, serr := os.Lstat(path); serr != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
			return nil // another process's store, made meanwhile
		}
		// An empty file: SQLite creates the file it opens, so a process
		// that opened the path while it had none made it. It is nobody's
		// store: replace it.
	default:
		// A file system without hard links: rename, after a look for a
		// file made meanwhile.
		if _, serr := os.Lstat(path); serr == nil {
			return nil
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return storageErr("create "+path, err)
	}
	return nil
}

// removeStaleFresh removes the files of processes that died in makeFresh:
// a file being made is seconds old at most.
func removeStaleFresh(path string) {
	dir, prefix := filepath.Dir(path), filepath.Base(path)+freshSuffix+"-"
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		name := filepath.Join(dir, e.Name())
		base := strings.TrimSuffix(strings.TrimSuffix(name, "-wal"), "-shm")
		if fi, err := os.Lstat(base); err == nil && time.Since(fi.ModTime()) < staleFresh {
			continue
		}
		_ = os.Remove(name)
	}
}

const (
	staleFresh  = 10 * time.Minute
	freshSuffix = ".new" // with a pid and a random number: makeFresh's file
)

// checkpointAll empties path's WAL into path, which is then the whole database.
func checkpointAll(ctx context.Context, path string, busy time.Duration) error {
	db, err := openDB(dsn(path, busy, false, false))
	if err != nil {
		return storageErr("checkpoint "+path, err)
	}
	defer func() { _ = db.Close() }()
	var busyFlag, logFrames, done int
	if err := db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busyFlag, &logFrames, &done); err != nil {
		return classify(path, err)
	}
	if busyFlag != 0 || done != logFrames {
		return fmt.Errorf("checkpoint %s: %d of %d frames written: %w", path, done, logFrames, store.ErrBusy)
	}
	return nil
}

func removeDBFiles(path string) {
	for _, suffix := range []string{"", "-wal", "-shm"} {
		_ = os.Remove(path + suffix)
	}
}

func tooNew(path string, st fileState, k schema) error {
	if st.dirty {
		return fmt.Errorf("%s has schema version %d, whose migration a newer berth has not finished (this berth knows up to %d); open it with that berth, or use another state directory: %w", path, st.version, k.latest, store.ErrSchemaTooNew)
	}
	return fmt.Errorf("%s has schema version %d of write version %d; this berth knows schema versions up to %d and writes only to stores of write version 1 to %d; upgrade berth or use another state directory: %w", path, st.version, st.writeVersion, k.latest, k.write, store.ErrSchemaTooNew)
}

// migrateUp applies the embedded migrations. golang-migrate's own runner marks a version dirty, runs its body and
// marks it clean in separate transactions, so a crash between leaves
// "dirty" for good, and a failure before the body is read blocks its
// goroutines forever (golang-migrate/migrate#1443). berth keeps its source
// and version table but applies each body with its version record in one
// transaction. A dirty mark left by an older berth is resolved by whether
// that body committed: each body records itself in schema_history.
func migrateUp(ctx context.Context, path string, st fileState, k schema, busy time.Duration, log logr.Logger) error {
	file, err := os.Stat(path)
	if err != nil {
		return storageErr("migrate "+path, err)
	}
	db, err := openDB(dsn(path, busy, false, true))
	if err != nil {
		return storageErr("migrate "+path, err)
	}
	// One connection, kept: every migration then goes to the file it
	// opened, checked below to be the one at the path, even if the file is
	// replaced meanwhile (whoever made the new one migrates it).
	oneConn(db)
	// The driver creates golang-migrate's version table; its Close closes db.
	drv, err := sqlite.WithInstance(db, &sqlite.Config{})
	if err != nil {
		_ = db.Close()
		return classify(path, err)
	}
	defer func() { _ = drv.Close() }()
	if !sameAsPath(file, path) {
		return fmt.Errorf("migrate %s: the file was replaced as it opened: %w", path, store.ErrLost)
	}
	src, err := iofs.New(k.src, "migrations")
	if err != nil {
		return fmt.Errorf("migrate %s: %w", path, err)
	}
	defer func() { _ = src.Close() }()

	from := st.version
	if st.dirty {
		if !st.applied[st.version] {
			from = 0 // the body left no trace: back to the version before
			if prev, err := src.Prev(st.version); err == nil {
				from = prev
			}
		}
		log.Info("resolving a migration cut short", "path", path, "version", st.version, "now", from)
		if err := inTx(ctx, db, func(tx *sql.Tx) error { return recordVersion(ctx, tx, from) }); err != nil {
			return fmt.Errorf("migrate %s: %w", path, classify(path, err))
		}
	}
	v := from
	for {
		next, err := src.Next(v)
		if v == 0 {
			next, err = src.First()
		}
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return fmt.Errorf("migrate %s: %w", path, err)
		}
		if err := applyMigration(ctx, db, src, next, k.writes[next]); err != nil {
			return fmt.Errorf("migrate %s from version %d to %d: %w", path, v, next, classify(path, err))
		}
		v = next
	}
	if v != from || st.dirty {
		log.Info("migrated state store", "path", path, "from", from, "to", v)
	}
	return nil
}

func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// recordVersion records v, clean, as the schema version (0: none).
func recordVersion(ctx context.Context, tx *sql.Tx, v uint) error {
	if _, err := tx.ExecContext(ctx, "DELETE FROM "+sqlite.DefaultMigrationsTable); err != nil {
		return err
	}
	if v == 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+sqlite.DefaultMigrationsTable+" (version, dirty) VALUES (?, 0)", int64(v))
	return err
}

// applyMigration runs the up body of v and records v, clean, and from
// migfiles.Compat on its write version w (PRAGMA user_version), in one
// transaction.
func applyMigration(ctx context.Context, db *sql.DB, src source.Driver, v, w uint) error {
	r, _, err := src.ReadUp(v)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(r)
	_ = r.Close()
	if err != nil {
		return err
	}
	return inTx(ctx, db, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			return err
		}
		if err := recordVersion(ctx, tx, v); err != nil || v < migfiles.Compat {
			return err
		}
		// PRAGMA takes no parameters; w is a number this berth parsed.
		_, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", w))
		return err
	})
}

func sameAsPath(fi os.FileInfo, path string) bool {
	now, err := os.Stat(path)
	return err == nil && os.SameFile(fi, now)
}

// setAsideIfEmptied sets the store's file aside, as openers do, when it was
// truncated to nothing: closing the last connection would checkpoint pages
// into it (SQLite skips that for a file no longer at its path).
func (s *sqlStore) setAsideIfEmptied() {
	if fi, err := os.Stat(s.path); err != nil || !os.SameFile(fi, s.file) || fi.Size() != 0 {
		return
	}
	lock := flock.New(s.path+".migrate.lock", flock.SetPermissions(0o600))
	defer func() { _ = lock.Close() }() // Close unlocks
	ctx, cancel := context.WithTimeout(context.Background(), s.busy)
	defer cancel()
	if ok, err := lock.TryLockContext(ctx, 5*time.Millisecond); !ok || err != nil {
		return
	}
	if fi, err := os.Stat(s.path); err == nil && os.SameFile(fi, s.file) {
		_, _ = setAsideLost(s.path, time.Now())
	}
}

// setAsideLost moves a database file that is gone, empty or holds no table
// (a connection set WAL mode on it once emptied) aside, with its WAL and
// -shm, and reports whether it moved anything. Holders of the old file still
// use that WAL: a new database on it would read their pages as its own. They
// find the file replaced instead, and put their rows back.
func setAsideLost(path string, now time.Time) (bool, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil || !fi.Mode().IsRegular():
		return false, nil //nolint:nilerr // not a database file: inspect judged it
	}
	_, werr := os.Lstat(path + "-wal")
	if _, serr := os.Lstat(path + "-shm"); werr != nil && serr != nil && (fi == nil || fi.Size() == 0) {
		return false, nil
	}
	aside := path + ".lost-" + strconv.FormatInt(now.UnixNano(), 10)
	for _, suffix := range []string{"", "-wal", "-shm"} {
		err := os.Rename(path+suffix, aside+suffix)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, storageErr("set aside "+path+suffix, err)
		}
	}
	return true, nil
}
