// Package statestore keeps port reservations in a SQLite file that every
// berth process on a host shares: the store of one host (see package store
// for the contract it keeps).
//
// # Reservations
//
// A reservation is made by Reserve or Scan, moved by Transfer, and ends by
// Release or reaping: once its owner has exited, or a named holder's lease
// has ended by a clock no wall-clock step moves (see lease.go), its row is
// deleted when it stands in the way, by the sweep Open starts, or by Reap.
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
// change is one older writers tolerate. Each store records its schema
// version (golang-migrate's schema_migrations table), which every migration
// raises, and its write version (PRAGMA user_version), which a migration
// raises only when berths that do not know it must stop writing. Every
// migration from version 6 on declares it in a line "-- write-version: N"
// of its up file: the previous migration's, or one more. Tolerated are new tables, new columns with a default (no
// statement of berth names a column it does not write or read), and new
// indexes; anything that changes what an existing column means, how rows
// are judged, or what a row must hold to be valid raises the write version.
// Berth releases before schema 6 refuse every newer schema.
//
// A Store stays usable while another process migrates the file under it:
// SQLite prepares a statement again when the schema changed, the view of
// held ports follows PRAGMA data_version, which every commit of another
// connection moves, and no migration rewrites a row a running berth holds.
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
	"github.com/berth-go/berth/internal/transient"
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

type sqlStore struct {
	path string
	file os.FileInfo  // the database file as opened, to notice a replacement
	wal  os.FileInfo  // its write-ahead log as the connection opened it, likewise
	size atomic.Int64 // the largest size the file was seen with, to notice a truncation
	log  logr.Logger
	now  func() time.Time
	self store.Owner
	busy time.Duration

	db *sql.DB

	// sem, a one-slot semaphore taken with a context, guards conn, st,
	// writeLock, spare and cache.
	sem       chan struct{}
	conn      *sql.Conn
	st        statements
	writeLock *filelock.File
	spare     *filelock.File // waitLock's own descriptor of the lock file, kept between waits
	cache     heldCache
	// live remembers owner liveness between calls: a dead owner stays dead
	// (its identity includes its start); a live one is asked again after liveTTL.
	live map[ownerKey]liveEntry

	commits    int           // this connection's write transactions; guarded by sem
	checkpoint chan struct{} // capacity 1: a pending nudge
	ckptDB     *sql.DB       // the checkpointer's own connection

	closed atomic.Bool
	bg     context.Context    // the background goroutines' context: Close ends it
	stop   context.CancelFunc // ends bg
	wg     sync.WaitGroup     // the sweep and the checkpointer

	remembered    atomic.Int64 // Remember calls, to prune sticky ports now and then
	reaped        atomic.Int64
	probeFailures atomic.Int64
}

var _ store.Store = (*sqlStore)(nil)

// Open opens the store at path, creating the directory (0700) and the file
// (0600) when they do not exist, and brings its schema up to date. A store
// removed or replaced while it opens is opened again (five tries at most);
// once ctx ends after such a change, the error wraps ctx.Err().
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
	// A store removed or replaced while it opens (a cleaner, another
	// process that set a truncated file aside) fails in ways that say
	// nothing of the store there now: open it again.
	for attempt := 1; ; attempt++ {
		before := placeOf(path)
		s, err := openOnce(ctx, path, self, opts)
		switch {
		case err == nil:
			return s, nil
		case attempt == maxOpenAttempts || !errors.Is(err, store.ErrLost) && (errors.Is(err, store.ErrBusy) || !before.changed(placeOf(path))):
			return nil, err // no typed nil in the interface
		case ctx.Err() != nil: // what err says of the file is out of date
			return nil, fmt.Errorf("%w (the store changed while it opened, and time ran out: %w)", err, ctx.Err())
		}
		opts.Logger.V(1).Info("the store was removed or replaced while it opened; opening it again", "path", path, "error", err.Error())
	}
}

const maxOpenAttempts = 5

// place is the directory and the file of a store at one moment (nil: missing).
type place struct{ dir, file os.FileInfo }

func placeOf(path string) place { return place{stat(filepath.Dir(path)), stat(path)} }

// stat returns path's file, or nil when it cannot be read.
func stat(path string) os.FileInfo {
	if fi, err := os.Stat(path); err == nil {
		return fi
	}
	return nil
}

// changed reports whether the directory (its inode, or its mtime: a new one
// may reuse the inode) or the file were removed, replaced or made between p and
// now, or the file shrank (a torn read), or the directory is still missing.
func (p place) changed(now place) bool {
	differ := func(then, now os.FileInfo) bool {
		return (then == nil) != (now == nil) || (then != nil && (!os.SameFile(then, now) || then.IsDir() && !then.ModTime().Equal(now.ModTime())))
	}
	shrank := p.file != nil && now.file != nil && now.file.Size() < p.file.Size()
	return differ(p.dir, now.dir) || differ(p.file, now.file) || shrank || p.dir == nil && now.dir == nil
}

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
	s := &sqlStore{
		path:       path,
		file:       file,
		wal:        stat(path + "-wal"),
		log:        opts.Logger,
		now:        opts.Now,
		self:       self,
		busy:       opts.BusyTimeout,
		db:         db,
		sem:        make(chan struct{}, 1),
		conn:       conn,
		st:         statements{conn: conn},
		checkpoint: make(chan struct{}, 1),
	}
	s.size.Store(file.Size())
	fail := func(err error) (*sqlStore, error) { //nolint:contextcheck // a close is bounded by the store's busy timeout, not by ctx
		_ = s.closeDB()
		return nil, err
	}
	if s.writeLock, err = filelock.Open(path + ".lock"); err != nil {
		if short := transient.Wrap(err); short != nil {
			err = short // a passing shortage, in its words
		}
		return fail(fmt.Errorf("open %s: %w", path, err))
	}
	if s.ckptDB, err = openDB(dsn(path, busySlice, false, false)); err != nil {
		return fail(fmt.Errorf("open %s: %w", path, err))
	}
	s.ckptDB.SetMaxOpenConns(1)
	// The connection may be on a file replaced since, which nobody else reads.
	if err := s.sameFile(); err != nil {
		return fail(fmt.Errorf("open %s: the file changed while it opened: %w", path, err))
	}
	if found > 0 && found < ownerFormatVersion {
		// A failure leaves the rows to the conservative judgement they get
		// wherever met.
		if conv, del, err := s.convertLegacyOwners(ctx); err != nil {
			s.log.Error(err, "could not convert owners recorded by an earlier berth; they are judged conservatively until a later open converts them", "path", path)
		} else if conv+del > 0 {
			s.log.Info("converted owners recorded by an earlier berth", "path", path, "converted", conv, "reaped", del)
		}
	}
	s.bg, s.stop = context.WithCancel(context.Background())
	if opts.SweepInterval > 0 {
		s.wg.Add(1)
		go s.sweep(opts.SweepInterval) //nolint:contextcheck // the sweep outlives Open's context; Close stops it
	}
	s.wg.Add(1)
	go s.checkpointer() //nolint:contextcheck // the checkpointer outlives Open's context; Close stops it
	return s, nil
}

// ownerFormatVersion is the first schema whose rows name owners by the
// kernel's start time.
const ownerFormatVersion = 3

// closeGrace is how long Close waits, beyond BusyTimeout, for a call in flight.
const closeGrace = time.Second

// Close is idempotent and bounded: a call still in flight after BusyTimeout
// plus closeGrace closes the database when it ends, and Close says so.
func (s *sqlStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.stop()
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
	errs := []error{s.st.close()}
	guard := s.closeGuard() // before the store's own connections close
	s.setAsideIfEmptied()
	errs = append(errs, s.conn.Close(), s.db.Close())
	if s.ckptDB != nil {
		errs = append(errs, s.ckptDB.Close())
	}
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

// closeGuard returns a read-only handle on the store's file when the WAL is
// under walKeepLimit, else nil. The last connection to close a WAL database
// checkpoints and truncates the WAL: four fsyncs, most of what a port cost
// a short-lived process (`berth get`, a test binary). SQLite skips that
// while another connection has the file open, and a read-only one cannot
// checkpoint: closed last, the guard leaves the WAL for the next
// process to append to. Only a power cut can lose its last frames, and it
// also ends every owner they name. Past the limit one process in many pays
// for the checkpoint, and none reads back a long WAL.
func (s *sqlStore) closeGuard() *sql.DB {
	fi, err := os.Stat(s.path + "-wal")
	if err != nil || fi.Size() > walKeepLimit {
		return nil
	}
	g, err := openDB(dsn(s.path, busySlice, true, false))
	if err != nil {
		return nil
	}
	var v int // read once, the connection holds its shared lock
	if err := g.QueryRow("PRAGMA schema_version").Scan(&v); err != nil {
		_ = g.Close()
		return nil
	}
	return g
}

func dsn(path string, busy time.Duration, readOnly, setWAL bool) string {
	d := dsnBare(path) + "?_pragma=busy_timeout(" + fmt.Sprint(busy.Milliseconds()) + ")"
	if readOnly {
		return d + "&mode=ro"
	}
	if setWAL {
		// Set only on a file that needs it: on one that is not berth's it
		// would rewrite that file's header.
		d += "&_pragma=journal_mode(WAL)"
	}
	return d + "&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate" +
		// The WAL file is kept (see openDB); the limit has the last
		// connection truncate it after its checkpoint, so the next process
		// neither reads old frames back nor copies them again.
		"&_pragma=journal_size_limit(" + fmt.Sprint(walSizeLimit) + ")" +
		// Checkpoints run in the background (see checkpointer); this
		// automatic one is only a backstop against a WAL that grows.
		"&_pragma=wal_autocheckpoint(" + fmt.Sprint(backstopCheckpointPages) + ")"
}

// testHookPrepared, when a test sets it, runs in openConn after prepareFile.
var testHookPrepared func()

// openConn opens the store's connection to path, with the file made ready,
// and returns the file as it was just before. A file of the current schema
// is inspected on that connection itself: a second one, closed first, would
// make SQLite checkpoint a WAL another process left, with two fsyncs. Any
// other file takes prepareFile's careful path, under the migration lock.
func openConn(ctx context.Context, path string, busy time.Duration, log logr.Logger) (*sql.DB, *sql.Conn, uint, os.FileInfo, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		db, conn, err := connect(ctx, path, busy, false)
		if unreadable(err) {
			goto prepare // prepareFile sets it aside
		} else if err != nil {
			return nil, nil, 0, nil, classify(path, err)
		}
		k, err := known()
		var st fileState
		if err == nil {
			st, err = inspectOn(ctx, path, conn)
		}
		ready := false
		if err == nil {
			ready, err = k.ready(path, st)
		}
		if err == nil && ready {
			if k.newerKnown(st) {
				log.V(1).Info("the store's schema is newer than this berth knows, of a write version it knows: writing to it", "path", path, "schema", st.version, "known", k.latest, "writeVersion", st.writeVersion)
			}
			if err = settle(ctx, conn); err == nil {
				return db, conn, st.version, fi, nil
			}
			err = classify(path, err)
		}
		_ = conn.Close()
		_ = db.Close()
		if err != nil && !unreadable(err) {
			return nil, nil, 0, nil, err
		}
	}
prepare:
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
		// prepareFile leaves a whole store: SQLite made this one, opening
		// the path of a store removed meanwhile.
		return nil, nil, 0, nil, fmt.Errorf("database file %s was removed while the store opened, and an empty file made in its place: %w", path, store.ErrLost)
	}
	db, conn, err := connect(ctx, path, busySlice, true)
	if err != nil {
		return nil, nil, 0, nil, classify(path, err)
	}
	return db, conn, found, fi, nil
}

// settle turns WAL mode back on (the sqlite3 shell can turn it off), and
// sets the store's short busy timeout.
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

// connect opens a handle of one connection on path and takes it: writers of
// this process take turns on it, so they never see SQLITE_BUSY from each other.
func connect(ctx context.Context, path string, busy time.Duration, setWAL bool) (*sql.DB, *sql.Conn, error) {
	db, err := openDB(dsn(path, busy, false, setWAL))
	if err != nil {
		return nil, nil, err
	}
	oneConn(db)
	conn, err := db.Conn(ctx)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return db, conn, nil
}

const (
	// checkpointEvery is how many of its own commits a Store makes between
	// background checkpoints, each an fsync that can stall other writers:
	// at 256, under six contending processes one call waited 184 ms; at
	// 2048 the worst of eight runs was 55 ms.
	checkpointEvery         = 2048
	backstopCheckpointPages = 8192      // WAL pages at which SQLite checkpoints inside a commit anyway
	walSizeLimit            = 1 << 20   // bytes: see dsn
	walKeepLimit            = 128 << 10 // bytes, about 30 processes that get and release a port: see closeGuard
)

func oneConn(db *sql.DB) {
	db.SetMaxOpenConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
}

// checkpointer copies the WAL back into the database file when nudged: a
// PASSIVE checkpoint on a connection of its own blocks no writer, while
// SQLite's automatic one holds the write lock of the commit that crosses
// its threshold through an fsync (the slowest calls under contention).
func (s *sqlStore) checkpointer() {
	defer s.wg.Done()
	for {
		select {
		case <-s.bg.Done():
			return
		case <-s.checkpoint:
		}
		if s.sameFile() != nil {
			continue // written back, pages would make a truncated file look whole
		}
		if _, err := s.ckptDB.ExecContext(s.bg, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil && !isBusy(err) && s.bg.Err() == nil {
			s.log.V(1).Info("background checkpoint failed", "error", err.Error())
		}
	}
}

// committed counts a commit, with the store acquired, and every
// checkpointEvery commits nudges the checkpointer.
func (s *sqlStore) committed() {
	s.commits++
	if s.commits%checkpointEvery == 0 {
		select {
		case s.checkpoint <- struct{}{}:
		default:
		}
	}
}

// dsnBare is the file: URI of path, with the characters that would end or escape it encoded.
func dsnBare(path string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(path))
	if !strings.HasPrefix(esc, "/") {
		esc = "/" + esc // Windows drive letters: file:/C:/...
	}
	return "file:" + esc
}

// acquire takes the in-process turn, then for writes the cross-process
// flock, and returns the function that gives both back. Every wait ends
// with ctx, the flock's also after BusyTimeout (store.ErrBusy).
func (s *sqlStore) acquire(ctx context.Context, write bool) (func(), error) {
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		// The background sweep, say, waiting for another process's lock.
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
	// Under the lock, a write that passes lands in the file every other
	// process uses (unless it is deleted meanwhile: write and exec check
	// again).
	if err := s.sameFile(); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// lockWrite takes the write lock for a caller that holds the turn, and
// returns the function that lets go of both.
func (s *sqlStore) lockWrite(ctx context.Context) (func(), error) {
	lock := s.writeLock
	ok, err := lock.TryLock()
	if err != nil {
		return nil, fmt.Errorf("write lock %s: %w", lock.Path(), err)
	}
	waited := !ok
	if waited {
		if lock, err = s.waitLock(ctx); err != nil {
			return nil, err
		}
	}
	return func() {
		if err := lock.Unlock(); err != nil {
			s.log.Error(err, "unlock write lock", "path", lock.Path())
			if waited {
				_ = lock.Close() // closing drops the lock whatever Unlock said
			}
		} else if waited {
			s.spare = lock
		}
		s.putTurn()
		if waited {
			filelock.Yield() // let a waiter run before this one locks again
		}
	}, nil
}

func (s *sqlStore) putTurn() { <-s.sem }

// waitLock waits for the write lock another process holds. A blocked flock
// wakes the moment the holder lets go, but cannot be interrupted: so it
// blocks in a goroutine on a descriptor of its own, which lets go of the
// lock once granted when ctx or BusyTimeout ended first. A frozen holder
// blocks that goroutine, never a caller or Close. The descriptor is kept
// for the next wait (s.spare): under 16 processes every write waits, and
// opening and closing it each time cost an eighth of their rate.
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
	return nil, fmt.Errorf("write lock %s is held by %s (%w): %w", s.writeLock.Path(), holder, why, store.ErrBusy)
}

func (s *sqlStore) locked(lock *filelock.File, err error) (*filelock.File, error) {
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("write lock %s: %w", s.writeLock.Path(), err)
	}
	return lock, nil
}
