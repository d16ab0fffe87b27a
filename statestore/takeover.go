package statestore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/internal/safefs"
)

// ErrMoved: the store at this path was moved elsewhere by TakeOver; the
// note it left (ReadMoved) says where. Open refuses such a path rather than
// start a second store beside the one that holds the reservations.
var ErrMoved = errors.New("state store moved")

// MovedSuffix is appended to a database path to name the note TakeOver
// leaves beside a store it moved away (berth.db.moved).
const MovedSuffix = ".moved"

// Moved is what the note of a moved store says.
type Moved struct {
	To string    // the database file the store now is
	At time.Time // when it moved
}

// ReadMoved reads the note TakeOver left beside the database path when it
// moved the store away. ok is false when there is no note. A note that is
// not berth's own (another user's, a symbolic link) or that cannot be
// understood is an error.
func ReadMoved(path string) (m Moved, ok bool, err error) {
	note := path + MovedSuffix
	f, err := safefs.OpenFile(note, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return Moved{}, false, nil
	}
	if err != nil {
		return Moved{}, false, fmt.Errorf("read %s: %w", note, err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), "moved-to: "); found {
			m.To = v
		}
		if v, found := strings.CutPrefix(sc.Text(), "moved-at: "); found {
			if m.At, err = time.Parse(time.RFC3339Nano, v); err != nil {
				return Moved{}, false, fmt.Errorf("read %s: moved-at %q: want an RFC 3339 time", note, v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Moved{}, false, fmt.Errorf("read %s: %w", note, err)
	}
	if m.To == "" || !filepath.IsAbs(m.To) || m.At.IsZero() {
		return Moved{}, false, fmt.Errorf("read %s: not a note of berth's (want the lines moved-to: with an absolute path and moved-at: with a time)", note)
	}
	return m, true, nil
}

// movedErr is Open's refusal of a path whose store was moved away.
func movedErr(path string, m Moved) error {
	return fmt.Errorf("the state store %s was moved to %s on %s (see %s): use the state directory %s; to start a new store here instead, remove %s and %s: %w",
		path, m.To, m.At.UTC().Format(time.DateTime+" MST"), path+MovedSuffix, filepath.Dir(m.To), path, path+MovedSuffix, ErrMoved)
}

// TakeOverOptions tune TakeOver. The zero value of every field is a
// working default.
type TakeOverOptions struct {
	// Logger receives what TakeOver did; zero: discard.
	Logger logr.Logger
	// BusyTimeout bounds each wait for a lock of either store, as
	// Options.BusyTimeout does for a call; zero: 5s.
	BusyTimeout time.Duration
	// Carry names files beside the old database (such as the MRU file,
	// mru.json) that move with it: each is copied, when it exists there and
	// not at the new place, before the database moves.
	Carry []string
	// Now is the clock for the note; zero: time.Now.
	Now func() time.Time
}

// TakeOver moves the state store whose database is the file from into the
// file to, with every reservation and sticky port in it, and reports
// whether it did. It does nothing (false, nil) when to exists already (an
// empty file, left by a crash, does not count), when from does not exist or
// is an empty file, or when from was moved already. It is made for a
// program that changes where its default store lives and must not lose the
// reservations of processes still running.
//
// The move excludes every writer of both stores: it holds from's write
// lock (<from>.lock, taken by every write transaction) and its migration
// lock, and to's migration lock (a new file is created only under it), and
// looks again under them, so any number of processes that take over at
// once move the store exactly once; the others wait and then find it
// moved. The copy is a consistent snapshot taken through SQLite (VACUUM
// INTO), rows still in the WAL included, written to a temporary file in
// to's directory, checked (it must hold as many reservations and sticky
// ports as from), synced, and renamed to to. Only then is from replaced by
// a note that says where the store went (also kept as <from>.moved, see
// ReadMoved), and its -wal and -shm files are removed. The note stands in
// for the database on purpose: an earlier berth that still uses from finds
// no database there, and refuses (in its statestore mode) or falls back to
// its MRU file with a warning on every call, where an empty place would
// have let it start a second store in silence and grant ports the moved
// one holds. A Store still open on from refuses to write once the file is
// replaced (it says to reopen), so nothing it does is lost in the old file.
//
// Both directories must pass the checks Open makes (owned by this user,
// written by no one else, no symbolic links where berth keeps its files):
// otherwise TakeOver refuses with an error wrapping ErrUnsafe and moves
// nothing. Any failure before the rename leaves from as it was and to
// absent, and the error says so; a failure to leave the note after the
// rename is logged, since the store has moved by then.
func TakeOver(ctx context.Context, from, to string, opts TakeOverOptions) (bool, error) {
	if opts.BusyTimeout <= 0 {
		opts.BusyTimeout = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	var err error
	if from, err = filepath.Abs(from); err != nil {
		return false, fmt.Errorf("take over %s: %w", from, err)
	}
	if to, err = filepath.Abs(to); err != nil {
		return false, fmt.Errorf("take over into %s: %w", to, err)
	}
	if from == to {
		return false, nil
	}
	// A look without locks settles the usual cases: the store has moved,
	// or there is none to move.
	if need, err := needTakeOver(from, to); !need || err != nil {
		return false, err
	}
	t := takeover{from: from, to: to, opts: opts}
	moved, err := t.run(ctx)
	if err != nil {
		return false, fmt.Errorf("take over the state store %s into %s: %w; nothing was moved, the store and its reservations are still in %s",
			from, to, err, filepath.Dir(from))
	}
	return moved, nil
}

// needTakeOver reports whether from holds a store to move and to none.
func needTakeOver(from, to string) (bool, error) {
	if fi, err := os.Lstat(to); err == nil {
		// An empty file is what a crash in a store's first open leaves
		// (a new database is made under the migration lock TakeOver holds
		// too): a place to fill, not a store.
		if !fi.Mode().IsRegular() || fi.Size() > 0 {
			return false, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, nil // cannot be looked at: Open deals with it
	}
	fi, err := os.Lstat(from)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("take over %s: %w", from, err)
	}
	if fi.Mode().IsRegular() && fi.Size() == 0 {
		return false, nil // a file created and never made a database
	}
	if _, err := os.Lstat(from + MovedSuffix); err == nil {
		return false, nil
	}
	return true, nil
}

type takeover struct {
	from, to string
	opts     TakeOverOptions
}

func (t *takeover) run(ctx context.Context) (bool, error) {
	oldDir, newDir := filepath.Dir(t.from), filepath.Dir(t.to)
	if err := checkStoreFiles(oldDir, t.from, t.opts.Carry); err != nil {
		return false, err
	}
	if err := checkStoreFiles(newDir, t.to, t.opts.Carry); err != nil {
		return false, err
	}
	// Locks in one order in every process: from's migration lock, from's
	// write lock, to's migration lock.
	for _, l := range []struct{ path, what string }{
		{t.from + ".migrate.lock", "migration lock"},
		{t.from + ".lock", "write lock"},
		{t.to + ".migrate.lock", "migration lock"},
	} {
		unlock, err := lockWithin(ctx, l.path, l.what, t.opts.BusyTimeout)
		if err != nil {
			return false, err
		}
		defer unlock()
	}
	// Another process may have moved the store while this one waited.
	if need, err := needTakeOver(t.from, t.to); !need || err != nil {
		return false, err
	}
	st, err := inspect(ctx, t.from, t.opts.BusyTimeout)
	if err != nil {
		return false, err
	}
	if st.fresh {
		return false, nil
	}
	tmp, rows, err := t.copy(ctx)
	if err != nil {
		return false, err
	}
	keep := false
	defer func() {
		if !keep {
			removeCopy(tmp)
		}
	}()
	var carried []string
	defer func() {
		if !keep {
			for _, c := range carried {
				_ = os.Remove(c)
			}
		}
	}()
	for _, name := range t.opts.Carry {
		dst, err := carry(filepath.Join(oldDir, name), filepath.Join(newDir, name))
		if err != nil {
			return false, err
		}
		if dst != "" {
			carried = append(carried, dst)
		}
	}
	if err := os.Rename(tmp, t.to); err != nil {
		return false, storageErr("rename "+tmp, err)
	}
	keep = true
	if err := syncDir(newDir); err != nil {
		t.opts.Logger.Error(err, "could not sync the directory of the moved store", "path", t.to)
	}
	t.leaveNote()
	t.opts.Logger.Info("moved the state store to its new place, with its reservations", "from", t.from, "to", t.to, "reservations", rows)
	return true, nil
}

// checkStoreFiles runs Open's safety checks on the directory of a store
// (created, mode 0700, when missing) and the files berth keeps in it.
func checkStoreFiles(dir, db string, carry []string) error {
	if err := safefs.PrepareDir(dir); err != nil {
		return err
	}
	files := []string{db, db + "-wal", db + "-shm", db + ".lock", db + ".migrate.lock", db + MovedSuffix}
	for _, c := range carry {
		files = append(files, filepath.Join(dir, c))
	}
	for _, f := range files {
		if err := safefs.CheckFile(f); err != nil {
			return err
		}
	}
	return nil
}

// copy writes a consistent copy of the old store to a temporary file in the
// new directory, checks it and syncs it, and returns its name and the
// number of reservations in it.
func (t *takeover) copy(ctx context.Context) (string, int, error) {
	f, err := os.CreateTemp(filepath.Dir(t.to), "."+filepath.Base(t.to)+".takeover-*") // mode 0600
	if err != nil {
		return "", 0, storageErr("create a file in "+filepath.Dir(t.to), err)
	}
	tmp := f.Name()
	if err := f.Close(); err != nil {
		removeCopy(tmp)
		return "", 0, storageErr("create "+tmp, err)
	}
	rows, err := t.vacuumInto(ctx, tmp)
	if err != nil {
		removeCopy(tmp)
		return "", 0, err
	}
	// No SQLite connection of this process has the copy open now, so a
	// descriptor of its own cannot drop anyone's locks.
	if err := syncFile(tmp); err != nil {
		removeCopy(tmp)
		return "", 0, storageErr("sync "+tmp, err)
	}
	return tmp, rows, nil
}

// vacuumInto copies the old store into the empty file tmp through SQLite,
// which reads the WAL as well as the database file, and compares what the
// copy holds with the original.
func (t *takeover) vacuumInto(ctx context.Context, tmp string) (int, error) {
	db, err := openDB(dsnBare(t.from) + fmt.Sprintf("?_pragma=busy_timeout(%d)", t.opts.BusyTimeout.Milliseconds()))
	if err != nil {
		return 0, storageErr("open "+t.from, err)
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, classify(t.from, err)
	}
	defer func() { _ = conn.Close() }()
	count := func(schema string) (rows, sticky int, err error) {
		if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM "+schema+".port_allocations").Scan(&rows); err != nil {
			return 0, 0, err
		}
		err = conn.QueryRowContext(ctx, "SELECT count(*) FROM "+schema+".sticky_ports").Scan(&sticky)
		return rows, sticky, err
	}
	// The writers are locked out, so the counts and the copy see one state.
	rows, sticky, err := count("main")
	if err != nil {
		return 0, classify(t.from, err)
	}
	if _, err := conn.ExecContext(ctx, "VACUUM INTO ?", tmp); err != nil {
		return 0, fmt.Errorf("copy %s: %w", t.from, classify(t.from, err))
	}
	if _, err := conn.ExecContext(ctx, "ATTACH DATABASE ? AS copy", tmp); err != nil {
		return 0, storageErr("check the copy "+tmp, err)
	}
	crows, csticky, cerr := count("copy")
	if _, err := conn.ExecContext(ctx, "DETACH DATABASE copy"); err != nil && cerr == nil {
		cerr = err
	}
	if cerr != nil {
		return 0, storageErr("check the copy "+tmp, cerr)
	}
	if crows != rows || csticky != sticky {
		return 0, fmt.Errorf("the copy %s holds %d reservations and %d sticky ports, the store %d and %d: %w", tmp, crows, csticky, rows, sticky, ErrStorage)
	}
	return rows, nil
}

// carry copies the file src to dst, atomically, unless src is missing or
// dst exists, and returns dst when it copied.
func carry(src, dst string) (string, error) {
	if _, err := os.Lstat(dst); err == nil {
		return "", nil
	}
	in, err := safefs.OpenFile(src, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer func() { _ = in.Close() }()
	out, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".takeover-*")
	if err != nil {
		return "", storageErr("copy "+src, err)
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(out.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(out.Name())
		return "", storageErr("copy "+src, err)
	}
	return dst, nil
}

// leaveNote writes the note of the move beside the old database, then puts
// a copy of it in the old database's place and removes its -wal and -shm
// files. The store has moved by now: failures are logged, not returned.
func (t *takeover) leaveNote() {
	log := t.opts.Logger
	at := t.opts.Now().UTC()
	note := fmt.Sprintf(`This berth state store has moved.

berth keeps its reservations in a state directory, not a cache directory:
cache cleaners delete a cache while the programs whose ports it records
still run. On %s berth (pid %d) moved the store
that was here, with every reservation and sticky port in it, to

    %s

Nothing here is used any more. This note stands where berth.db was, so that
an earlier berth still using this directory finds no database here and does
not start a second one: it refuses (in its statestore mode) or falls back to
its MRU file with a warning on every call. Upgrade it, or point it at the new
directory with BERTH_STATE_DIR. Remove this directory once no program
started before the move still runs.

moved-to: %s
moved-at: %s
`, at.Format(time.DateTime+" MST"), os.Getpid(), t.to, t.to, at.Format(time.RFC3339Nano))
	dir := filepath.Dir(t.from)
	for _, dst := range []string{t.from + MovedSuffix, t.from} {
		if err := writeAtomic(dst, note); err != nil {
			log.Error(err, "the store has moved, but the note saying where could not be left in its old place", "path", dst, "movedTo", t.to)
			return
		}
	}
	for _, f := range []string{t.from + "-wal", t.from + "-shm"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.V(1).Info("could not remove a file of the moved store", "path", f, "error", err.Error())
		}
	}
	if err := syncDir(dir); err != nil {
		log.V(1).Info("could not sync the old state directory", "path", dir, "error", err.Error())
	}
}

// writeAtomic replaces the file path with one holding s, mode 0600.
func writeAtomic(path, s string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".note-*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// removeCopy removes a temporary copy and whatever SQLite left beside it.
func removeCopy(tmp string) {
	for _, f := range []string{tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"} {
		_ = os.Remove(f)
	}
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir makes a rename in dir durable. Windows cannot sync a directory,
// and makes renames durable by itself.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// lockWithin takes the lock file at path, polling until it is free, ctx is
// done or wait has passed; unlock lets it go. An error names the holder
// where the OS tells.
func lockWithin(ctx context.Context, path, what string, wait time.Duration) (unlock func(), err error) {
	l, err := filelock.Open(path)
	if err != nil {
		return nil, storageErr(what+" "+path, err)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		ok, err := l.TryLock()
		if err != nil {
			_ = l.Close()
			return nil, storageErr(what+" "+path, err)
		}
		if ok {
			return func() { _ = l.Close() }, nil // closing lets the lock go
		}
		var why error
		select {
		case <-time.After(delay):
			continue
		case <-ctx.Done():
			why = ctx.Err()
		case <-timer.C:
			why = fmt.Errorf("waited %v", wait)
		}
		_ = l.Close()
		holder := "another process"
		if h, found := filelock.HolderOf(path); found {
			holder = h.String()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s is held by %s: %w: %w", what, path, holder, ErrBusy, why)
		}
		return nil, fmt.Errorf("%s %s is held by %s (%w): %w", what, path, holder, why, ErrBusy)
	}
}
