// Package statestore keeps port reservations in a SQLite file that every
// berth process on a host shares: the store of one host (see package store
// for the contract it keeps).
//
// # store.Reservation lifecycle
//
// A reservation holds a (protocol, address, port) for an owner process. It
// is created by Reserve (a given port) or Scan (the first free port among
// candidates), moved to another process by Transfer, and ends by Release or
// reaping: once its owner has exited, the row is deleted
// when it stands in the way of a new reservation, by the sweep that Open
// starts in the background, or by Reap.
//
// A reservation can instead belong to a named holder under a lease (an
// Owner with Holder set, and a TTL): it outlives the process that asked,
// and ends by Release or once its lease has ended, by a clock no wall-clock
// step moves (see lease.go), after which it is reaped as the row of an
// exited owner is.
//
// Two reservations of one protocol and port conflict under the rule of
// package store: equal addresses, or either address a wildcard.
//
// # Concurrency
//
// A Store is safe for concurrent use. Within a process its calls share one
// connection, one at a time, so goroutines never meet SQLITE_BUSY. Across
// processes every write transaction is preceded by an exclusive flock of the
// sidecar file <db>.lock, which the kernel hands to the next waiter as soon
// as it is free; the probe a caller supplies runs inside that transaction, so
// no other process can choose the same port between probe and insert.
//
// # A lost file
//
// A file deleted, replaced or truncated under its holders (a cache cleaner,
// rm -rf, a restore) is noticed by Check, which then fails with
// store.ErrLost, and by a write that meets it; portalloc reopens the store
// and puts its rows back. Between the loss and that, the rows are missing
// from the store, not the reservations: every berth process also holds a
// kernel lock for each port it reserves (package portlock), which every
// grant takes, so no port a live holder keeps is granted from a store made
// anew.
//
// # Versions that share a store
//
// Programs that vendor different berth versions share one store, and a
// newer berth never makes an older one stop writing, as long as its schema
// change is one older writers tolerate. Each store records two numbers: its
// schema version (golang-migrate's schema_migrations table), which every
// migration raises, and its write version (the database header's PRAGMA
// user_version), which a migration raises only when berths that do not
// know it must stop writing. Every migration from version 6 on declares
// its write version in a line "-- write-version: N" of its up file: the
// previous migration's number when older writers tolerate the change, one
// more otherwise. Tolerated are new tables, new columns with a default (no
// statement of berth names a column it does not write or read), and new
// indexes; anything that changes what an existing column means, how rows
// are judged, or what a row must hold to be valid raises the write version.
//
// Open migrates an older schema up to SchemaVersion. A store of a newer
// schema whose write version is at most WriteVersion is used as it is,
// with the full guarantee (its log says so at V(1)); only a newer write
// version, or a newer schema whose migration was cut short, makes Open
// refuse it with store.ErrSchemaTooNew. A Store stays usable while another
// process migrates the file under it: SQLite prepares a statement again
// when the schema changed, the view of held ports follows PRAGMA
// data_version, which every commit of another connection moves, and no
// migration rewrites a row a running berth holds. Berth releases before
// schema 6 knew no write version: they refuse every newer schema.
package statestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	_ "modernc.org/sqlite" // the database/sql driver "sqlite"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/store"
)

// Options tune a Store. The zero value of every field is a working default.
type Options struct {
	// Logger receives the store's log; zero: discard.
	Logger logr.Logger
	// BusyTimeout bounds how long a call waits for a write lock that a
	// process outside berth's own locking holds; zero: 5s.
	BusyTimeout time.Duration
	// SweepInterval is the period of the background reaping sweep, which
	// first runs SweepInterval or a second after Open, whichever is
	// sooner; zero: 1 minute; negative: no sweep.
	SweepInterval time.Duration
	// Now is the clock for created_at; zero: time.Now.
	Now func() time.Time
}

// sqlStore is an open state store.
type sqlStore struct {
	path string
	file os.FileInfo  // the database file as opened, to notice a replacement
	size atomic.Int64 // the largest size the file was seen with, to notice a truncation
	log  logr.Logger
	now  func() time.Time
	self store.Owner
	busy time.Duration

	db *sql.DB

	// sem is a one-slot semaphore taken with a context. It guards conn, the
	// prepared statements, writeLock, spare and cache.
	sem       chan struct{}
	conn      *sql.Conn
	st        statements
	writeLock *filelock.File
	spare     *filelock.File // waitLock's own descriptor of the lock file, kept between waits
	cache     heldCache
	live      liveness

	// commits counts this connection's write transactions; every
	// checkpointEvery of them it nudges the checkpointer. Guarded by sem.
	commits    int
	checkpoint chan struct{} // capacity 1: a pending nudge
	ckptDB     *sql.DB       // the checkpointer's own connection

	closed atomic.Bool
	stop   chan struct{}  // closed by Close to end the background goroutines
	wg     sync.WaitGroup // the sweep and the checkpointer

	remembered    atomic.Int64 // Remember calls, to prune sticky ports now and then
	reaped        atomic.Int64
	probeFailures atomic.Int64
}

var _ store.Store = (*sqlStore)(nil)

// Open opens the store at path, creating the directory (0700) and the file
// (0600) when they do not exist, and brings its schema up to date.
//
// Open refuses, with an error wrapping store.ErrUnsafe, a directory or file that
// another user owns or that others may write, and a symbolic link where it
// keeps its own files: another user could otherwise swap in a database or
// point a lock file elsewhere.
//
// Open refuses, with an error wrapping store.ErrDamaged, a path that is a
// directory, a file that is not SQLite, a damaged database and a SQLite
// database of another program; it never modifies or removes such a file.
// It refuses, with store.ErrSchemaTooNew, a schema of a write version newer than
// WriteVersion (see the package doc), and uses a newer schema of a write
// version it knows as it is.
func Open(ctx context.Context, path string, opts Options) (store.Store, error) {
	s, err := open(ctx, path, opts)
	if err != nil {
		return nil, err // no typed nil in the interface
	}
	return s, nil
}

func open(ctx context.Context, path string, opts Options) (*sqlStore, error) {
	if path == "" {
		return nil, &store.FieldError{Field: "path", Value: "", Want: "a file path for the database"}
	}
	if opts.BusyTimeout <= 0 {
		opts.BusyTimeout = 5 * time.Second
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	self, err := store.Self()
	if err != nil {
		return nil, err
	}
	path, err = filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// A store removed or replaced while it opens (a cleaner at work, or
	// another process that just set a truncated file aside) fails in ways
	// that say nothing of the store that is there now: open it again. An
	// error wrapping store.ErrLost says so itself; otherwise the directory or
	// the file changed (a directory made again may have the inode number
	// of the one removed, so that alone is not proof).
	for attempt := 1; ; attempt++ {
		before := placeOf(path)
		s, err := openOnce(ctx, path, self, opts)
		if err == nil || attempt == maxOpenAttempts || ctx.Err() != nil {
			return s, err
		}
		if !errors.Is(err, store.ErrLost) && !before.changed(placeOf(path)) {
			return s, err
		}
		opts.Logger.V(1).Info("the store was removed or replaced while it opened; opening it again", "path", path, "error", err.Error())
	}
}

// maxOpenAttempts bounds how often Open starts again because the store
// changed under it.
const maxOpenAttempts = 5

// place is the directory and the file of a store as they were at one
// moment (nil: missing), to tell whether either was removed or replaced.
type place struct{ dir, file os.FileInfo }

func placeOf(path string) place {
	stat := func(p string) os.FileInfo {
		fi, err := os.Stat(p)
		if err != nil {
			return nil
		}
		return fi
	}
	return place{stat(filepath.Dir(path)), stat(path)}
}

// changed reports whether the directory or the file were removed, replaced
// or made between p and now, or the file shrank (truncated under the
// attempt, which then read a short or torn file). A failed attempt that
// made them itself is tried once more too: another process may have
// removed and made them again in between.
func (p place) changed(now place) bool {
	differ := func(then, now os.FileInfo) bool {
		return (then == nil) != (now == nil) || (then != nil && !os.SameFile(then, now))
	}
	shrank := p.file != nil && now.file != nil && now.file.Size() < p.file.Size()
	return differ(p.dir, now.dir) || differ(p.file, now.file) || shrank
}

// openOnce is one attempt of Open on an absolute path.
func openOnce(ctx context.Context, path string, self store.Owner, opts Options) (*sqlStore, error) {
	if err := safefs.PrepareDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	for _, f := range []string{path, path + "-wal", path + "-shm", path + ".lock", path + ".migrate.lock"} {
		if err := safefs.CheckFile(f); err != nil {
			return nil, err
		}
	}
	db, conn, found, file, err := openConn(ctx, path, opts.BusyTimeout, opts.Logger)
	if err != nil {
		return nil, err
	}
	writeLock, err := filelock.Open(path + ".lock")
	if err != nil {
		_ = conn.Close()
		_ = db.Close()
		return nil, shortErr("open "+path, err)
	}
	ckptDB, err := openDB(dsn(path, busySlice, false, false))
	if err != nil {
		_ = writeLock.Close()
		_ = conn.Close()
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	ckptDB.SetMaxOpenConns(1)
	s := &sqlStore{
		path:       path,
		log:        opts.Logger,
		now:        opts.Now,
		self:       self,
		busy:       opts.BusyTimeout,
		db:         db,
		sem:        make(chan struct{}, 1),
		conn:       conn,
		writeLock:  writeLock,
		checkpoint: make(chan struct{}, 1),
		ckptDB:     ckptDB,
		stop:       make(chan struct{}),
	}
	// The connection opened the file that was at the path just before it
	// connected; if that is still the one there, it is the store every
	// other process uses. If it was replaced meanwhile (a cleaner, another
	// process that set a truncated file aside), the connection may be on
	// the old one, which nobody else reads: Open starts again.
	s.file = file
	s.size.Store(file.Size())
	if err := s.sameFile(); err != nil {
		_ = s.closeDB()
		return nil, fmt.Errorf("open %s: the file changed while it opened: %w", path, err)
	}
	s.st.prepare(conn)
	if found > 0 && found < ownerFormatVersion {
		// The file was just migrated from a schema whose rows name owners
		// by wall-clock start times: rewrite them once. A failure leaves
		// them to the conservative judgement they get wherever met.
		if conv, del, err := s.convertLegacyOwners(ctx); err != nil {
			s.log.Error(err, "could not convert owners recorded by an earlier berth; they are judged conservatively until a later open converts them", "path", path)
		} else if conv+del > 0 {
			s.log.Info("converted owners recorded by an earlier berth", "path", path, "converted", conv, "reaped", del)
		}
	}
	if opts.SweepInterval > 0 {
		s.wg.Add(1)
		go s.sweep(opts.SweepInterval) //nolint:contextcheck // the sweep outlives Open's context; Close stops it
	}
	s.wg.Add(1)
	go s.checkpointer() //nolint:contextcheck // the checkpointer outlives Open's context; Close stops it
	return s, nil
}

// Path returns the database file's absolute path.
func (s *sqlStore) Path() string { return s.path }

// ownerFormatVersion is the schema version from which rows name owners by
// the kernel's start time; rows of older schemas are converted on Open.
const ownerFormatVersion = 3

// closeGrace is how long Close waits, beyond BusyTimeout, for a call in
// flight to end before it leaves the database to be closed by that call.
const closeGrace = time.Second

// Close stops the background sweep and closes the database. It does not
// release reservations: they belong to their owners. Close is idempotent
// and bounded: a call still in flight after BusyTimeout plus a second (it is
// bounded itself) closes the database when it ends, and Close returns an
// error saying so.
func (s *sqlStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.wg.Wait() // the sweep's and the checkpointer's calls end with stop
	wait := time.NewTimer(s.busy + closeGrace)
	defer wait.Stop()
	select {
	case s.sem <- struct{}{}: // the call in flight is done; nothing takes the turn again
		return s.closeDB()
	case <-wait.C:
		go func() {
			s.sem <- struct{}{}
			_ = s.closeDB()
		}()
		return fmt.Errorf("close: a call was still running after %v; the database closes when it returns", s.busy+closeGrace)
	}
}

func (s *sqlStore) closeDB() error {
	var errs []error
	errs = append(errs, s.st.close())
	guard := s.closeGuard() // before the store's own connections close
	if s.conn != nil {
		errs = append(errs, s.conn.Close())
	}
	errs = append(errs, s.db.Close(), s.ckptDB.Close())
	if guard != nil {
		errs = append(errs, guard.Close())
	}
	if s.writeLock != nil {
		errs = append(errs, s.writeLock.Close())
	}
	if s.spare != nil {
		errs = append(errs, s.spare.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// closeGuard returns an open read-only handle on the store's file when the
// WAL is small enough to leave for the next process, or nil.
//
// The last connection to close a WAL database checkpoints it, fsyncing the
// WAL and the database file, and (with journal_size_limit set) truncates the
// WAL; the next process to write then starts a new WAL, fsyncing its header
// and the directory. For short-lived processes (`berth get`, a test binary)
// those four fsyncs were most of what a port cost. SQLite skips the
// checkpoint when another connection still has the file open, and a
// read-only connection cannot checkpoint at all: closed after the store's
// own connections, the guard leaves the WAL as it is, and the next process
// appends to it with no fsync at all. The frames are as safe in the WAL as
// in the database file (SQLite reads both, and a crash of any process loses
// neither); only a power cut can lose the last of them, and it also ends
// every owner those frames name. Once the WAL is past walKeepLimit the
// store closes without a guard, so one process in many pays for the
// checkpoint and a fresh process never reads back a long WAL.
func (s *sqlStore) closeGuard() *sql.DB {
	fi, err := os.Stat(s.path + "-wal")
	if err != nil || fi.Size() > walKeepLimit {
		return nil
	}
	g, err := openDB(dsn(s.path, busySlice, true, false))
	if err != nil {
		return nil
	}
	// A connection holds its shared lock on the database file once it has
	// read it.
	var v int
	if err := g.QueryRow("PRAGMA schema_version").Scan(&v); err != nil {
		_ = g.Close()
		return nil
	}
	return g
}

// dsn builds the driver's data source name. The path goes in as a file: URI
// with the characters that would end or escape it encoded.
func dsn(path string, busy time.Duration, readOnly, setWAL bool) string {
	if readOnly {
		return dsnBare(path) + "?mode=ro&_pragma=busy_timeout(" + fmt.Sprint(busy.Milliseconds()) + ")"
	}
	d := dsnBare(path) + "?_pragma=busy_timeout(" + fmt.Sprint(busy.Milliseconds()) + ")"
	if setWAL {
		// WAL mode is recorded in the file: a database that has it needs
		// no setting, and setting it on one that is not berth's would
		// rewrite that file's header.
		d += "&_pragma=journal_mode(WAL)"
	}
	return d + "&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate" +
		// The WAL file is kept when the last connection closes (see
		// openDB); with a limit set, that connection, having checkpointed
		// it, truncates it to nothing, so the next process neither reads
		// old frames to rebuild its index nor copies them back again.
		"&_pragma=journal_size_limit(" + fmt.Sprint(walSizeLimit) + ")" +
		// Checkpoints run in the background (see checkpointer); this
		// automatic one is only a backstop against a WAL that grows.
		"&_pragma=wal_autocheckpoint(" + fmt.Sprint(backstopCheckpointPages) + ")"
}

// testHookPrepared, when set by a test, runs in openConn right after
// prepareFile has made or checked the file.
var testHookPrepared func()

// openConn opens the store's connection to path, with the file made ready
// first. The usual file, one of the current schema, is inspected on that
// connection itself, so a fresh process opens the database once: a second
// connection would also be the last to close, which makes SQLite check the
// WAL and, when another process left it unchecked, checkpoint it with two
// fsyncs before the store's first call. Any other file (none yet, an older
// schema, one to refuse) takes the careful path: prepareFile inspects it
// under the migration lock and migrates it, and then the connection opens.
//
// It also returns the file as it was just before the connection opened it,
// for the caller to check that it is still the one at the path.
func openConn(ctx context.Context, path string, busy time.Duration, log logr.Logger) (*sql.DB, *sql.Conn, uint, os.FileInfo, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		db, conn, err := connect(ctx, path, busy, false)
		if err != nil {
			return nil, nil, 0, nil, classify(path, err)
		}
		k, err := known()
		var st fileState
		if err == nil {
			st, err = inspectOn(ctx, path, conn)
		}
		if err == nil && k.refuses(st) {
			err = tooNew(path, st, k)
		}
		if err == nil && k.usable(st) {
			if k.newerKnown(st) {
				log.V(1).Info("the store's schema is newer than this berth knows, of a write version it knows: writing to it", "path", path, "schema", st.version, "known", k.latest, "writeVersion", st.writeVersion)
			}
			if err := settle(ctx, conn); err != nil {
				_ = conn.Close()
				_ = db.Close()
				return nil, nil, 0, nil, classify(path, err)
			}
			return db, conn, st.version, fi, nil
		}
		_ = conn.Close()
		_ = db.Close()
		if err != nil {
			return nil, nil, 0, nil, err
		}
	}
	found, err := prepareFile(ctx, path, busy, log)
	if err != nil {
		return nil, nil, 0, nil, err
	}
	if testHookPrepared != nil {
		testHookPrepared()
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, 0, nil, fmt.Errorf("database file %s was removed while the store opened: %w", path, store.ErrLost)
	case err != nil:
		return nil, nil, 0, nil, classify(path, err)
	case fi.Size() == 0:
		// prepareFile leaves a whole store at path: an empty file is one
		// that SQLite made, opening the path of a store removed meanwhile.
		return nil, nil, 0, nil, fmt.Errorf("database file %s was removed while the store opened, and an empty file made in its place: %w", path, store.ErrLost)
	}
	db, conn, err := connect(ctx, path, busySlice, true)
	if err != nil {
		return nil, nil, 0, nil, classify(path, err)
	}
	return db, conn, found, fi, nil
}

// settle readies a connection that inspected a berth database of the
// current schema: WAL mode back on if someone turned it off (the sqlite3
// shell can), and the store's short busy timeout.
func settle(ctx context.Context, conn *sql.Conn) error {
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		if _, err := conn.ExecContext(ctx, "PRAGMA journal_mode = WAL"); err != nil {
			return err
		}
	}
	_, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", busySlice.Milliseconds()))
	return err
}

// connect opens a database handle of one connection on path and takes that
// connection.
func connect(ctx context.Context, path string, busy time.Duration, setWAL bool) (*sql.DB, *sql.Conn, error) {
	db, err := openDB(dsn(path, busy, false, setWAL))
	if err != nil {
		return nil, nil, err
	}
	// One connection: writers in this process take turns on it through
	// sem, so they never see SQLITE_BUSY from each other.
	db.SetMaxOpenConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	conn, err := db.Conn(ctx)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return db, conn, nil
}

const (
	// checkpointEvery is how many of its own commits a Store makes between
	// background checkpoints. Each checkpoint fsyncs the database, which
	// can stall other writers in the file system: at 256, six contending
	// processes checkpointed about 100 times a second and one call in six
	// runs waited 184 ms; at 2048 the worst of eight runs was 55 ms.
	checkpointEvery = 2048
	// backstopCheckpointPages is the WAL size, in pages, at which SQLite
	// checkpoints inside a commit anyway.
	backstopCheckpointPages = 8192
	// walSizeLimit is the size, in bytes, to which SQLite trims the WAL
	// file when it starts it over after a checkpoint.
	walSizeLimit = 1 << 20
	// walKeepLimit is the WAL size, in bytes, up to which a closing store
	// leaves the WAL for the next process (see closeGuard): about 30
	// processes that allocate and release a port each.
	walKeepLimit = 128 << 10
)

// checkpointer copies the WAL back into the database file when nudged.
// SQLite's automatic checkpoint runs inside the commit that crosses its
// threshold, holding the write lock through an fsync: the slowest calls
// under contention were those. A PASSIVE checkpoint on a connection of its
// own blocks no writer.
func (s *sqlStore) checkpointer() {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-s.checkpoint:
		}
		if s.sameFile() != nil {
			// Pages written back into a file that was truncated would
			// make it look whole again, and hide the loss.
			continue
		}
		if _, err := s.ckptDB.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil && !isBusy(err) && ctx.Err() == nil {
			s.log.V(1).Info("background checkpoint failed", "error", err.Error())
		}
	}
}

// committed counts a commit and nudges the checkpointer now and then. It
// must be called with the store acquired.
func (s *sqlStore) committed() {
	s.commits++
	if s.commits%checkpointEvery == 0 {
		select {
		case s.checkpoint <- struct{}{}:
		default:
		}
	}
}

// dsnBare is the file: URI of path with no parameters.
func dsnBare(path string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(path))
	if !strings.HasPrefix(esc, "/") {
		esc = "/" + esc // Windows drive letters: file:/C:/...
	}
	return "file:" + esc
}

// acquire takes the store for one call: the in-process turn, then for writes
// the cross-process flock. The returned function gives both back. Every wait
// ends with ctx, and the flock wait also after BusyTimeout, with an error
// wrapping store.ErrBusy that names the lock's holder where the OS tells.
func (s *sqlStore) acquire(ctx context.Context, write bool) (func(), error) {
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		// Another call of this process had the store all along: the
		// background sweep, say, waiting for the write lock that another
		// process holds.
		return nil, fmt.Errorf("%w: another call of this process had the store until the call's end: %w", store.ErrBusy, ctx.Err())
	}
	if s.closed.Load() {
		s.putTurn()
		return nil, store.ErrClosed
	}
	if !write {
		return s.putTurn, nil
	}
	release, err := s.lockWrite(ctx)
	if err != nil {
		s.putTurn()
		return nil, err
	}
	// Checked under the lock, so that a write that passes lands in the
	// file every other process uses, unless it is deleted meanwhile,
	// which write and exec check again.
	if err := s.sameFile(); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// lockWrite takes the cross-process write lock for a caller that holds the
// turn, and returns the function that lets go of both.
func (s *sqlStore) lockWrite(ctx context.Context) (func(), error) {
	ok, err := s.writeLock.TryLock()
	if err != nil {
		return nil, fmt.Errorf("write lock %s: %w", s.writeLock.Path(), err)
	}
	if ok {
		return func() {
			if err := s.writeLock.Unlock(); err != nil {
				s.log.Error(err, "unlock write lock", "path", s.writeLock.Path())
			}
			s.putTurn()
		}, nil
	}
	lock, err := s.waitLock(ctx)
	if err != nil {
		return nil, err
	}
	return func() {
		if err := lock.Unlock(); err != nil {
			s.log.Error(err, "unlock write lock", "path", lock.Path())
			_ = lock.Close() // closing drops the lock whatever Unlock said
		} else {
			s.spare = lock
		}
		s.putTurn()
		// Another process may be waiting as this one did: let it run
		// before this one can take the lock again (see filelock.Yield).
		filelock.Yield()
	}, nil
}

// putTurn gives back the in-process turn taken by acquire.
func (s *sqlStore) putTurn() { <-s.sem }

// waitLock waits for the write lock that another process holds. The kernel
// wakes a blocked flock the moment the holder lets go, with no polling, but
// a blocked flock cannot be interrupted. So the wait runs in a goroutine on
// a lock file of its own: when ctx or BusyTimeout ends it first, the caller
// leaves with the turn given back, and the goroutine, once the kernel grants
// it the lock, lets go of it and ends. A holder that stays frozen keeps that
// goroutine blocked, never a caller or Close. The waiter's descriptor is
// kept for the next wait (s.spare) unless its wait was abandoned: under 16
// processes every write waits, and opening and closing the file each time
// cost an eighth of their rate.
func (s *sqlStore) waitLock(ctx context.Context) (*filelock.File, error) {
	lock := s.spare
	s.spare = nil
	if lock == nil {
		var err error
		if lock, err = s.writeLock.Reopen(); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("write lock %s is gone with its directory: %w", s.writeLock.Path(), store.ErrLost)
		} else if err != nil {
			return nil, fmt.Errorf("write lock %s: %w", s.writeLock.Path(), err)
		}
	}
	var (
		mu        sync.Mutex // guards abandoned and the hand-over on done
		abandoned bool
		done      = make(chan error, 1)
	)
	go func() {
		err := lock.Lock()
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			_ = lock.Close() // nobody waits: let the lock go at once
			return
		}
		done <- err
	}()
	timer := time.NewTimer(s.busy)
	defer timer.Stop()
	var why error
	select {
	case err := <-done:
		return s.locked(lock, err)
	case <-ctx.Done():
		why = ctx.Err()
	case <-timer.C:
		why = fmt.Errorf("waited %v", s.busy)
	}
	mu.Lock()
	select {
	case err := <-done: // granted while we gave up: take it after all
		mu.Unlock()
		return s.locked(lock, err)
	default:
		abandoned = true
		mu.Unlock()
	}
	holder := "another process"
	if h, ok := filelock.HolderOf(s.writeLock.Path()); ok {
		holder = h.String()
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("write lock %s is held by %s: %w: %w", s.writeLock.Path(), holder, store.ErrBusy, why)
	}
	return nil, fmt.Errorf("write lock %s is held by %s (%w): %w", s.writeLock.Path(), holder, why, store.ErrBusy)
}

func (s *sqlStore) locked(lock *filelock.File, err error) (*filelock.File, error) {
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("write lock %s: %w", s.writeLock.Path(), err)
	}
	return lock, nil
}
