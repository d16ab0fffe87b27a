package statestore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/gofrs/flock"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/internal/marker"
	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/internal/transient"
)

// A store whose file disappears under its holders (a cache cleaner, rm -rf,
// a file replaced or truncated) loses their rows: the next process creates
// an empty store and could grant their ports. Two things keep that from
// happening:
//
//   - Each holder notices the loss (sameFile, before and after every write)
//     and, through portalloc, reopens the store and puts its rows back.
//   - Until it does, its marks speak for it: for every row it holds for
//     itself, the process holds a mark in the abstract unix namespace
//     (package marker), which no file operation removes and which ends with
//     the process. A store that has just been created reads the marks of
//     its path and records their holders' rows before anything is granted
//     from it (importMarks).

// KeepMarksAcrossExec makes the marks this process holds (see the package
// doc of portalloc, "Losing the store") pass to the program it is about to
// become through exec, as berth run becomes its command: that program
// keeps the pid, and so the reservations, and now also the marks that keep
// them when the store's file is lost. Call it right before exec; it is a
// no-op where marks do not exist.
func KeepMarksAcrossExec() error { return marker.Inherit() }

// markOf returns the mark of own's reservation of key, and false when own
// is no process of this boot that the mark can name (a lease holder, an
// owner recorded by an earlier berth).
//
// This process marks the rows it writes for itself, which it holds for as
// long as it lives, and also those it writes for, or hands to, another
// process (a child, the shell of berth get): such a mark lasts while both
// live, which covers the moment between a hand-off and the child's bind.
// Marks of owners that have exited are dropped by the sweep (pruneMarks).
func (s *Store) markOf(key Key, own Owner) (marker.Mark, bool) {
	boot, pidNS, timeNS, current := owner.ScopeParts(own.Scope)
	if !current || own.PID <= 0 || (boot != "" && boot != owner.BootID()) {
		return marker.Mark{}, false
	}
	return marker.Mark{
		Protocol: string(key.Protocol), Addr: key.Addr, Port: key.Port,
		PID: own.PID, Start: own.Start,
		PidNS: nsNumber(pidNS), TimeNS: nsNumber(timeNS),
	}, true
}

// markOwner is the owner a mark names, as importMarks records it.
func markOwner(m marker.Mark) Owner {
	return Owner{PID: m.PID, Start: m.Start, Scope: owner.MakeScope(nsString(m.PidNS), nsString(m.TimeNS))}
}

// pruneMarks drops the marks this process holds, in this store's
// namespace, for owners that have exited: those of reservations it wrote
// for, or handed to, other processes.
func (s *Store) pruneMarks(ctx context.Context) {
	marker.Prune(s.ns, func(m marker.Mark) bool { return m.PID == s.self.PID || markOwner(m).Alive(ctx) })
}

func nsNumber(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64) // 0: unknown
	return n
}

func nsString(n uint64) string {
	if n == 0 {
		return ""
	}
	return strconv.FormatUint(n, 10)
}

// holdMark marks own's new reservation of key, inside the transaction that
// inserts it, so the mark exists before the row can be seen. The store must
// be acquired. When this process's own reservation cannot be marked for
// want of a descriptor, the write fails with an error wrapping
// ErrTransient: granted without its mark, the port would be unguarded
// should the store be lost before the next check. A row for another owner,
// or a process that holds Limit marks already, goes without one.
func (s *Store) holdMark(key Key, own Owner) error {
	m, ok := s.markOf(key, own)
	if !ok {
		return nil
	}
	made, err := marker.Hold(s.ns, m)
	if err != nil {
		if own.Same(s.self) && !errors.Is(err, marker.ErrTooMany) && transient.Is(err) {
			return shortErr("mark "+key.String(), err)
		}
		s.log.V(1).Info("could not mark a reservation", "key", key.String(), "error", err.Error())
		return nil
	}
	if made {
		// Only a mark made now goes if the write fails: one made
		// earlier (a row put back after a loss) stays with its row.
		s.txMarks = append(s.txMarks, m)
	}
	return nil
}

// markFor marks own's reservation of key, a row about to be handed to
// own, and reports whether it made the mark now. When it cannot for want
// of a descriptor it fails with an error wrapping ErrTransient, as
// holdMark does: handed over unmarked, the row would be lost with the
// file while own lives. A process that holds Limit marks already hands it
// over without one.
func (s *Store) markFor(key Key, own Owner) (bool, error) {
	m, ok := s.markOf(key, own)
	if !ok {
		return false, nil
	}
	made, err := marker.Hold(s.ns, m)
	if err != nil {
		if !errors.Is(err, marker.ErrTooMany) && transient.Is(err) {
			return false, shortErr("mark "+key.String()+" for "+own.String(), err)
		}
		s.log.V(1).Info("could not mark a reservation", "key", key.String(), "error", err.Error())
	}
	return made, nil
}

// dropMark ends the mark of own's reservation of key, and reports whether
// this process held it.
func (s *Store) dropMark(key Key, own Owner) bool {
	if m, ok := s.markOf(key, own); ok {
		return marker.Drop(s.ns, m)
	}
	return false
}

// settleMarks ends the marks of a write that did not take effect and
// forgets the rest. The store must be acquired.
func (s *Store) settleMarks(failed bool) {
	if failed {
		for _, m := range s.txMarks {
			marker.Drop(s.ns, m)
		}
	}
	s.txMarks = s.txMarks[:0]
}

// sameFile fails, with an error wrapping ErrLost, when the database file at
// the store's path is no longer the one it opened: deleted, replaced, or
// truncated (to nothing, or smaller than it was). Writing on would put reservations where no other
// process looks.
func (s *Store) sameFile() error { return s.checkFile(true) }

// sameFileStat is sameFile without reading the file's header: a stat.
func (s *Store) sameFileStat() error { return s.checkFile(false) }

func (s *Store) checkFile(header bool) error {
	fi, err := os.Stat(s.path)
	if err != nil || !os.SameFile(fi, s.file) {
		if m, moved, merr := ReadMoved(s.path); merr == nil && moved {
			return movedErr(s.path, m) // TakeOver moved it
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("database file %s is gone: %w", s.path, ErrLost)
	case err != nil:
		return storageErr("stat "+s.path, err)
	case !os.SameFile(fi, s.file):
		return fmt.Errorf("database file %s was replaced since the store opened it: %w", s.path, ErrLost)
	case s.truncated(fi, header):
		return fmt.Errorf("database file %s was truncated since the store opened it: %w", s.path, ErrLost)
	}
	if n := fi.Size(); n > s.size.Load() {
		s.size.Store(n) // one writer at a time grows it; a lost race only delays noticing
	}
	return nil
}

// truncated reports whether the store's file, fi, was truncated since the
// store opened it. berth never shrinks its file (it never vacuums): one
// that is empty or smaller than it was seen was truncated, and a
// checkpoint may have written some pages back since. A checkpoint that
// copies the whole WAL also extends the file to its old length: the first
// page then lacks SQLite's header unless it was in the WAL too, and the
// pages that were not in the WAL are holes (hasHole), whose rows are gone.
func (s *Store) truncated(fi os.FileInfo, header bool) bool {
	if fi.Size() == 0 || fi.Size() < s.size.Load() {
		return true
	}
	if !header || s.head == nil {
		return false
	}
	var b [len(sqliteHeader)]byte
	n, err := s.head.ReadAt(b[:], 0)
	if n < len(b) || (err != nil && !errors.Is(err, io.EOF)) || string(b[:]) != sqliteHeader {
		return true
	}
	if s.page2 > 0 && !btreePage(s.head, s.page2) {
		return true
	}
	return s.holes && hasHole(s.head, fi.Size())
}

// The second page of berth's file is the root of golang-migrate's table of
// versions, written when the file is made and by migrations only, so it is
// in the WAL almost never: a truncation loses it even when a checkpoint
// writes back the first page, which shares its file system block. Its
// first byte tells a b-tree page (SQLite's page types 2, 5, 10 and 13) from
// the zeros of a lost one.

// secondPage returns the offset of the second page of the file f, whose
// first page begins with SQLite's header, and 0 when it has no second
// page that is a b-tree page (then the check is not made).
func secondPage(f *os.File, size int64) int64 {
	var h [18]byte
	if n, _ := f.ReadAt(h[:], 0); n < len(h) || string(h[:len(sqliteHeader)]) != sqliteHeader {
		return 0
	}
	ps := int64(binary.BigEndian.Uint16(h[16:18]))
	if ps == 1 {
		ps = 65536
	}
	if ps < 512 || size < 2*ps || !btreePage(f, ps) {
		return 0
	}
	return ps
}

// btreePage reports whether the page at offset off of f begins as a b-tree
// page does.
func btreePage(f *os.File, off int64) bool {
	var t [1]byte
	if n, _ := f.ReadAt(t[:], off); n < 1 {
		return false
	}
	switch t[0] {
	case 2, 5, 10, 13:
		return true
	}
	return false
}

// sqliteHeader is how every SQLite database file begins.
const sqliteHeader = "SQLite format 3\x00"

// Check reports, with an error wrapping ErrLost, that the database file is
// no longer the one the store opened (see store.Checker); a closed store
// reports ErrClosed.
func (s *Store) Check(context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.sameFile()
}

// setAsideLost moves the WAL and shared-memory files of a database file
// that is gone or was truncated to nothing out of the way, with the empty
// file, so that the store made in its place is a file of its own. Holders
// of the old file still use that WAL: a new database opened on it would
// read their pages as its own, or wait on their locks for as long as they
// live. They find the file replaced instead, and put their rows back. The
// caller holds the migration and write locks. It reports whether it moved
// anything.
func setAsideLost(path string, now time.Time) (bool, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil || !fi.Mode().IsRegular() || fi.Size() != 0:
		return false, nil //nolint:nilerr // a file with pages: inspect judges it
	}
	if !exists(path+"-wal") && !exists(path+"-shm") {
		return false, nil
	}
	return true, moveAside(path, "lost", now)
}

// moveAside renames path and its WAL and shared-memory files to
// path+"."+tag+"-<now>", keeping every byte.
func moveAside(path, tag string, now time.Time) error {
	aside := path + "." + tag + "-" + strconv.FormatInt(now.UnixNano(), 10)
	for _, suffix := range []string{"", "-wal", "-shm"} {
		err := os.Rename(path+suffix, aside+suffix)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return storageErr("set aside "+path+suffix, err)
		}
	}
	return nil
}

// SetAsideIfTruncated moves the store's file aside, with its WAL, when it
// is still the file the store opened and it was truncated since (see
// sameFile): a checkpoint may have written some pages back into it, so that
// it is neither empty, which a new store would replace, nor whole, and
// every process that opens it would find it damaged. The store knows it
// was truncated; a process that opens the file afresh cannot tell it from
// one damaged otherwise, which berth never moves on its own. It takes the
// migration and write locks, as a new file's creation does, and reports
// whether it moved the file. portalloc's Allocator calls it before it
// opens a lost store again.
func (s *Store) SetAsideIfTruncated(ctx context.Context) (bool, error) {
	fi, err := os.Stat(s.path)
	if err != nil || !os.SameFile(fi, s.file) || (fi.Size() != 0 && !s.truncated(fi, true)) {
		return false, nil //nolint:nilerr // gone or replaced: nothing of this store's to move
	}
	lock := flock.New(s.path+".migrate.lock", flock.SetPermissions(0o600))
	defer func() { _ = lock.Close() }()
	lctx, cancel := context.WithTimeout(ctx, s.busy)
	defer cancel()
	if ok, err := lock.TryLockContext(lctx, 5*time.Millisecond); !ok || err != nil {
		return false, fmt.Errorf("migration lock %s: %w", lock.Path(), ErrBusy)
	}
	defer func() { _ = lock.Unlock() }()
	wl, err := lockWrites(ctx, s.path, s.busy)
	if err != nil {
		return false, err
	}
	defer func() { _ = wl.Close() }()
	// Under the locks, again: another holder may have done it.
	fi, err = os.Stat(s.path)
	if err != nil || !os.SameFile(fi, s.file) || (fi.Size() != 0 && !s.truncated(fi, true)) {
		return false, nil //nolint:nilerr // done by another holder meanwhile
	}
	if err := moveAside(s.path, "lost", time.Now()); err != nil {
		return false, err
	}
	s.log.Info("the database file was truncated under its holders; set it aside with its WAL for a new one", "path", s.path, "size", fi.Size(), "was", s.size.Load())
	return true, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// lockWrites takes the store's write lock for the creation of a fresh file,
// waiting at most busy, so that no process grants from the new file before
// the marks of the live holders are in it.
func lockWrites(ctx context.Context, path string, busy time.Duration) (*filelock.File, error) {
	l, err := filelock.Open(path + ".lock")
	if err != nil {
		return nil, storageErr("write lock "+path+".lock", err)
	}
	deadline := time.Now().Add(busy)
	for {
		ok, err := l.TryLock()
		if err != nil {
			_ = l.Close()
			return nil, storageErr("write lock "+l.Path(), err)
		}
		if ok {
			if !l.Current() {
				_ = l.Close()
				return nil, fmt.Errorf("write lock %s was removed or replaced while this process waited for it: %w", l.Path(), ErrLost)
			}
			return l, nil
		}
		if err := ctx.Err(); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("write lock %s: %w", l.Path(), err)
		}
		if time.Now().After(deadline) {
			_ = l.Close()
			return nil, fmt.Errorf("write lock %s is held by another process (waited %v): %w", l.Path(), busy, ErrBusy)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// markKey is what a row is keyed by, as a mark names it.
type markKey struct {
	protocol string
	addr     netip.Addr
	port     uint16
}

// pickMarks chooses, for each key that marks name, the one mark whose
// owner a new store records as the key's holder, judging owners with
// judge. A key can have several: a child that was handed a port has
// exited, and its parent has not yet dropped the mark it held for it, while
// a process that reserved the port since holds its own. The first listed
// is no better than any other, so:
//
//   - marks of owners that surely exited are left out;
//   - an owner seen running is preferred to one that cannot be judged
//     (another namespace, an unreadable /proc);
//   - with no owner seen running and more than one that cannot be judged,
//     the first is taken, unless one could not be judged for a passing
//     shortage (this process out of descriptors or memory): the choice is
//     then a guess that could record an exited owner and leave the live
//     one out, so pickMarks fails with ErrTransient and the store is not
//     made until the marks can be read.
//
// Marks are returned in the order of the first mark of each key.
func pickMarks(marks []marker.Mark, judge func(marker.Mark) (owner.Verdict, error)) ([]marker.Mark, error) {
	type candidates struct {
		live, unknown []marker.Mark
		short         error // a shortage that kept an owner from being judged
	}
	var order []markKey
	byKey := make(map[markKey]*candidates)
	for _, m := range marks {
		k := markKey{m.Protocol, m.Addr, m.Port}
		c := byKey[k]
		if c == nil {
			c = &candidates{}
			byKey[k] = c
			order = append(order, k)
		}
		v, err := judge(m)
		switch v {
		case owner.Dead:
		case owner.Live:
			c.live = append(c.live, m)
		default:
			c.unknown = append(c.unknown, m)
			if err != nil && transient.Is(err) && c.short == nil {
				c.short = err
			}
		}
	}
	picked := make([]marker.Mark, 0, len(order))
	for _, k := range order {
		c := byKey[k]
		switch {
		case len(c.live) > 0:
			picked = append(picked, c.live[0])
		case len(c.unknown) > 1 && c.short != nil:
			short := c.short
			if !errors.Is(short, transient.ErrTransient) {
				short = transient.Wrap(short)
			}
			return nil, fmt.Errorf("state store: %d marks name %s/%d on %s, and which of their holders still runs cannot be read: %w",
				len(c.unknown), k.protocol, k.port, k.addr, short)
		case len(c.unknown) > 0:
			picked = append(picked, c.unknown[0])
		}
	}
	return picked, nil
}

// testHookImport, when set by a test, runs first in importMarks and fails
// it with its error.
var testHookImport func() error

// importMarks records, in file, the database just made for the store at
// path, a row for every mark of a live holder of path, and returns how
// many it recorded. The rows carry no label (marks have none) until their
// holders put their own rows back.
func importMarks(ctx context.Context, path, file string, busy time.Duration, log logr.Logger) (int, error) {
	if testHookImport != nil {
		if err := testHookImport(); err != nil {
			return 0, err
		}
	}
	marks, err := marker.List(marker.Namespace(path))
	if err != nil {
		return 0, err
	}
	if len(marks) == 0 {
		log.V(1).Info("a new state store found no live holder's mark to take over", "path", path, "marks", 0)
		return 0, nil
	}
	picked, err := pickMarks(marks, func(m marker.Mark) (owner.Verdict, error) {
		return owner.Judge(ctx, identity(markOwner(m)))
	})
	if err != nil {
		return 0, err
	}
	db, err := openDB(dsn(file, busy, false, false))
	if err != nil {
		return 0, storageErr("open "+file, err)
	}
	defer func() { _ = db.Close() }()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, classify(file, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	now := time.Now().UnixNano()
	n := 0
	for _, m := range picked {
		packed, err := netaddr.Pack(m.Addr)
		if err != nil {
			continue
		}
		own := markOwner(m)
		res, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO port_allocations
			(protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, '', 'dynamic', ?)`,
			m.Protocol, int(m.Port), packed, own.PID, own.Start, own.Scope, owner.NameOf(ctx, own.PID), now)
		if err != nil {
			return 0, classify(file, err)
		}
		if k, _ := res.RowsAffected(); k > 0 {
			n++
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, classify(file, err)
	}
	if n > 0 {
		log.Info("a new state store took over the reservations of live holders from their marks", "path", path, "reservations", n, "marks", len(marks))
	} else {
		log.V(1).Info("a new state store found no live holder's mark to take over", "path", path, "marks", len(marks))
	}
	return n, nil
}
