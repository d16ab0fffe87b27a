package statestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/internal/marker"
	"github.com/berth-go/berth/statestore"
)

// A store made where a live holder's file was lost takes the holder's
// reservations from its marks before it grants anything; the holder's own
// store reports the loss; a file truncated to nothing under a live
// connection is set aside with its WAL instead of blocking every caller.
func TestNewStoreTakesLiveHoldersMarks(t *testing.T) {
	if !marker.Supported() {
		t.Skip("no abstract unix namespace on this system: holders put their rows back when they notice")
	}
	ctx := context.Background()
	for _, loss := range []struct {
		name string
		lose func(path string) error
	}{
		{"removed", func(path string) error { return os.RemoveAll(filepath.Dir(path)) }},
		{"replaced by an empty file", func(path string) error {
			if err := os.Remove(path); err != nil {
				return err
			}
			return os.WriteFile(path, nil, 0o600)
		}},
		{"truncated", func(path string) error { return os.Truncate(path, 0) }},
		// A checkpoint of a holder's WAL after the truncation wrote the
		// last page back: the file is as long as it was, but its first
		// page, not in the WAL, is gone.
		{"truncated, then its last page written back", func(path string) error {
			fi, err := os.Stat(path)
			if err != nil {
				return err
			}
			if err := os.Truncate(path, 0); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			page := make([]byte, 4096)
			for i := range page {
				page[i] = 0x5a
			}
			_, err = f.WriteAt(page, max(fi.Size()-int64(len(page)), int64(len(page))))
			return errors.Join(err, f.Close())
		}},
	} {
		t.Run(loss.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state", "berth.db")
			ports := []uint16{24101, 24102}
			list, _ := json.Marshal(ports)
			w := startWorker(t, "hold", path, "BERTH_TEST_PORTS="+string(list))
			if e := w.next(t); e.Event != "done" {
				t.Fatalf("holder: %+v", e)
			}
			// This process's own store of the same file, with a row of its
			// own, to see its loss reported.
			mine := openAt(t, path)
			if _, err := mine.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24103), Label: "mine"}); err != nil {
				t.Fatal(err)
			}
			if err := mine.Check(ctx); err != nil {
				t.Fatalf("Check before the loss = %v; want nil", err)
			}
			if err := loss.lose(path); err != nil {
				t.Fatal(err)
			}
			if err := mine.Check(ctx); !errors.Is(err, statestore.ErrLost) {
				t.Fatalf("Check after the loss = %v; want ErrLost", err)
			}
			if _, err := mine.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24104)}); !errors.Is(err, statestore.ErrLost) {
				t.Fatalf("Reserve on the lost file = %v; want ErrLost", err)
			}
			truncated := strings.HasPrefix(loss.name, "truncated")
			if truncated {
				// What an Allocator does before it opens the store again:
				// a file with pages but no header would be refused as
				// damaged by every process that opens it.
				if moved, err := mine.SetAsideIfTruncated(ctx); err != nil || (!moved && loss.name != "truncated") {
					t.Fatalf("SetAsideIfTruncated = %v, %v; want the file set aside", moved, err)
				}
			}

			fresh := openAt(t, path)
			rows, err := fresh.List(ctx, statestore.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			var got []uint16
			for _, r := range rows {
				got = append(got, r.Port)
				if r.Port != 24103 && r.Owner.PID != w.cmd.Process.Pid {
					t.Errorf("row %v owned by %v; want the holder, pid %d", r, r.Owner, w.cmd.Process.Pid)
				}
			}
			if want := []uint16{24101, 24102, 24103}; !slices.Equal(got, want) {
				t.Fatalf("ports of the new store = %v; want %v: both of the live holder's and this process's", got, want)
			}
			for _, p := range ports {
				if _, err := fresh.Reserve(ctx, statestore.Request{Key: tcp(lo4, p)}); !isHeld(err) {
					t.Errorf("Reserve of the holder's port %d in the new store = %v; want ErrHeld", p, err)
				}
			}
			// The holder's own row, put back by this process, gets its label.
			r, err := fresh.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24103), Label: "mine"})
			if err != nil || r.Label != "mine" {
				t.Errorf("Reserve of this process's own port = %v, %v; want its row, labelled mine", r, err)
			}
			if truncated {
				aside, _ := filepath.Glob(path + ".lost-*")
				if len(aside) == 0 || !slices.ContainsFunc(aside, func(p string) bool { return strings.HasSuffix(p, "-wal") }) {
					t.Errorf("files set aside = %v; want the truncated file and its WAL", aside)
				}
			}
			// The holder exits: its marks go with it, and a store made now
			// knows nothing of it.
			_ = w.stdin.Close()
			_ = w.cmd.Wait()
			if err := os.RemoveAll(filepath.Dir(path)); err != nil {
				t.Fatal(err)
			}
			again := openAt(t, path)
			rows, err = again.List(ctx, statestore.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 1 || rows[0].Port != 24103 {
				t.Errorf("rows of a store made after the holder exited = %v; want only this process's", rows)
			}
		})
	}
}

// A row this process handed to a child is marked by this process while
// both live: a store made after a loss has it, so the port stays the
// child's in the moment before the child binds it.
func TestNewStoreTakesHandedOffRows(t *testing.T) {
	if !marker.Supported() {
		t.Skip("no abstract unix namespace on this system")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	s := openAt(t, path)
	to := liveChild(t)
	if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24111), Label: "child"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Transfer(ctx, tcp(lo4, 24111), statestore.Owner{}, to); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	fresh := openAt(t, path)
	rows, err := fresh.List(ctx, statestore.Filter{Port: 24111})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || !rows[0].Owner.Same(to) {
		t.Fatalf("rows of port 24111 in the new store = %v; want the child's (%v)", rows, to)
	}
}

// A file truncated under a live store, after another process's write and a
// checkpoint that emptied the WAL (so the store must read the file again):
// the next write fails with ErrLost, for the caller to open the store
// again, and not with ErrStorage, which would make it fall back. (The
// store also checks the file when a transaction fails, for a truncation
// between its check before the transaction and the transaction's first
// read, which then fails with "no such table".)
func TestTruncatedWithEmptyWALIsLost(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s := openAt(t, path)
	if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24141)}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	// Another process's write, so the store reads the file again at its
	// next transaction, then a checkpoint that empties the WAL.
	for _, q := range []string{"CREATE TABLE scratch (x)", "PRAGMA wal_checkpoint(TRUNCATE)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_ = db.Close()
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24142)})
	if !errors.Is(err, statestore.ErrLost) || errors.Is(err, statestore.ErrStorage) {
		t.Fatalf("Reserve on a file truncated under the store = %v; want ErrLost, not ErrStorage", err)
	}
}

// A file truncated under its holders into which a checkpoint of another
// process then wrote the pages of the WAL back: the header and the length
// are as before, but the pages that were not in the WAL are holes, and
// their rows are gone. The store reports it lost.
func TestTruncatedAndWrittenBackIsLost(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s := openAt(t, path)
	before := truncateWrittenBack(t, s, path)
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 16)
	if f, err := os.Open(path); err == nil {
		_, _ = f.ReadAt(head, 0)
		_ = f.Close()
	}
	if after.Size() < before.Size() || string(head) != "SQLite format 3\x00" {
		t.Fatalf("after the truncation and the checkpoint the file is %d bytes (was %d) and begins %q: the test wants a file that looks whole", after.Size(), before.Size(), head)
	}
	if err := s.Check(ctx); !errors.Is(err, statestore.ErrLost) {
		t.Fatalf("Check of a file truncated and written back = %v; want ErrLost", err)
	}
}

// A process that makes a new store where a lost one was never replaces a
// store another process put in place meanwhile: two may make one at once
// when the directory is removed again under the first one's locks, and the
// second's file may already have granted ports. The first drops its own
// file and opens the one in place.
func TestNewStoreNeverReplacesOneMadeMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		removeDir bool
	}{{"beside", false}, {"directory removed again", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			// The store "another process" made: one reservation in it.
			other := filepath.Join(t.TempDir(), "berth.db")
			o := openAt(t, other)
			if _, err := o.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24151)}); err != nil {
				t.Fatal(err)
			}
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("sqlite", "file:"+other+"?_pragma=busy_timeout(5000)")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
				t.Fatal(err)
			}
			_ = db.Close()
			made, err := os.ReadFile(other) // the whole store, in its file alone
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "state", "berth.db")
			once := false
			statestore.BeforeImport(t, func() {
				if once {
					return
				}
				once = true
				if tc.removeDir {
					if err := os.RemoveAll(filepath.Dir(path)); err != nil {
						t.Error(err)
					}
					if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
						t.Error(err)
					}
				}
				if err := os.WriteFile(path, made, 0o600); err != nil {
					t.Error(err)
				}
			})
			s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rows, err := s.List(ctx, statestore.Filter{})
			if err != nil || len(rows) != 1 || rows[0].Port != 24151 {
				t.Fatalf("the store opened = %v, %v; want the one put in place meanwhile, with its reservation of 24151", rows, err)
			}
			entries, _ := os.ReadDir(filepath.Dir(path))
			for _, e := range entries {
				if strings.Contains(e.Name(), ".new") {
					t.Errorf("%s left in the state directory", e.Name())
				}
			}
		})
	}
}

// What a process that died while it made a new store left behind is
// removed by the next one that makes the store, once it is old enough
// that no live process can be making it still; a younger one is left.
func TestNewStoreRemovesLeftoversOfDeadMakers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.db")
	old, young := path+".new-4242-abc", path+".new-4343-def"
	for _, name := range []string{old, old + "-wal", young} {
		if err := os.WriteFile(name, []byte("leftover"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hourAgo := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	openAt(t, path) // a new store: made where none was
	for _, name := range []string{old, old + "-wal"} {
		if _, err := os.Lstat(name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v; want it removed", filepath.Base(name), err)
		}
	}
	if _, err := os.Lstat(young); err != nil {
		t.Errorf("%s: %v; want it left (its maker may still be at work)", filepath.Base(young), err)
	}
}

// A file truncated under the store and written back by a checkpoint whose
// pages fill every file system block they touch, so that no hole shows:
// its second page, which a checkpoint almost never writes, is zeros, and
// the store reports the file lost.
func TestTruncatedSecondPageIsLost(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s := openAt(t, path)
	if !statestore.ChecksSecondPage(s) {
		t.Fatal("the store did not find a b-tree page second in its file")
	}
	truncateWrittenBack(t, s, path)
	statestore.IgnoreHoles(s) // as on a file system that shows no holes
	if err := s.Check(ctx); !errors.Is(err, statestore.ErrLost) {
		t.Fatalf("Check of a file truncated and written back, its holes not looked for = %v; want ErrLost", err)
	}
}

// truncateWrittenBack fills s's file at path, checkpoints it, writes more
// (so that its first and last pages are in the WAL), truncates it to
// nothing and lets another connection checkpoint the WAL back into it, as
// a holder that has not noticed the truncation would. It returns the
// file as it was before the truncation.
func truncateWrittenBack(t *testing.T, s *statestore.Store, path string) os.FileInfo {
	t.Helper()
	ctx := context.Background()
	reserve := func(first, n int) {
		t.Helper()
		for p := first; p < first+n; p++ {
			if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, uint16(p))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	reserve(24000, 300)
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	reserve(24300, 300) // the file grows: its first and last pages are in the WAL
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
		t.Fatal(err)
	}
	return before
}

// A process stopped (or frozen) right after its Release committed, while
// the file is lost and another process makes the store anew and reserves
// the port: the releaser's mark is gone before its row, so the new store
// has no row of a port released, and the other process gets it. A mark
// that outlived its row gave the new store the releaser's row instead,
// and the port's next holder could not put its own row back.
func TestReleasedPortIsNotInANewStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	key := tcp(lo4, 24112)
	s := reservedAndMarked(t, path, statestore.Options{SweepInterval: -1}, key)
	next := liveChild(t)
	var (
		ran        bool
		reserveErr error
		rows       []statestore.Reservation
	)
	statestore.AfterWrite(t, func() {
		// The releaser stands still here, its row deleted.
		ran = true
		if err := os.RemoveAll(filepath.Dir(path)); err != nil {
			reserveErr = err
			return
		}
		fresh, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil {
			reserveErr = err
			return
		}
		defer fresh.Close()
		_, reserveErr = fresh.Reserve(ctx, statestore.Request{Key: key, Owner: next})
		rows, _ = fresh.List(ctx, statestore.Filter{Port: key.Port})
	})
	if err := s.Release(ctx, key, statestore.Owner{}); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("the hook after the release's commit did not run")
	}
	if reserveErr != nil {
		t.Fatalf("Reserve of %s by another process in a store made right after its release = %v; want it granted", key, reserveErr)
	}
	if len(rows) != 1 || !rows[0].Owner.Same(next) {
		t.Errorf("rows of %s in the new store = %v; want one, the new holder's (%v)", key, rows, next)
	}
}

// A Release that fails in a file that is still the store's leaves the
// reservation held, and marked: a store made anew after a later loss still
// learns of it. One that fails because the file was lost leaves no mark:
// a store made anew has no row of a port being released. (Release drops
// the mark before it deletes the row.)
func TestFailedReleaseMarks(t *testing.T) {
	if !marker.Supported() {
		t.Skip("no abstract unix namespace on this system")
	}
	ctx := context.Background()
	marked := func(t *testing.T, path string, key statestore.Key) bool {
		t.Helper()
		marks, err := marker.List(marker.Namespace(path))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range marks {
			if m.Protocol == string(key.Protocol) && m.Addr == key.Addr && m.Port == key.Port && m.PID == os.Getpid() {
				return true
			}
		}
		return false
	}
	t.Run("write lock held", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		key := tcp(lo4, 24113)
		s := reservedAndMarked(t, path, statestore.Options{SweepInterval: -1, BusyTimeout: 200 * time.Millisecond}, key)
		takeWriteLock(t, path) // another holder of the write lock
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := s.Release(tctx, key, statestore.Owner{}); err == nil || errors.Is(err, statestore.ErrLost) {
			t.Fatalf("Release while another holds the write lock = %v; want a failure, not ErrLost", err)
		}
		if !marked(t, path, key) {
			t.Errorf("after a Release that failed on a held lock, %s has no mark of this process's", key)
		}
	})
	t.Run("write lock held, file lost meanwhile", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		key := tcp(lo4, 24118)
		s := reservedAndMarked(t, path, statestore.Options{SweepInterval: -1, BusyTimeout: 200 * time.Millisecond}, key)
		takeWriteLock(t, path) // the holder replaces the file
		replaceWithEmpty(t, path)
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := s.Release(tctx, key, statestore.Owner{}); err == nil {
			t.Fatal("Release while another holds the write lock = nil; want a failure")
		}
		if marked(t, path, key) {
			t.Errorf("after a Release that waited in vain while its file was replaced, %s is still marked", key)
		}
	})
	t.Run("file lost", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		s := openAt(t, path)
		key := tcp(lo4, 24116)
		if _, err := s.Reserve(ctx, statestore.Request{Key: key}); err != nil {
			t.Fatal(err)
		}
		replaceWithEmpty(t, path)
		if err := s.Release(ctx, key, statestore.Owner{}); !errors.Is(err, statestore.ErrLost) {
			t.Fatalf("Release on a replaced file = %v; want ErrLost", err)
		}
		if marked(t, path, key) {
			t.Errorf("after a Release that met a lost file, %s is still marked", key)
		}
	})
}

// A process stopped right after its Transfer committed, while the file is
// lost and another process makes the store anew: the old owner's mark went
// before the write, so the new store has the row as the new owner's, and
// no mark of the old owner's competes with it.
func TestTransferredPortIsTheNewOwnersInANewStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	key := tcp(lo4, 24114)
	s := reservedAndMarked(t, path, statestore.Options{SweepInterval: -1}, key)
	to := liveChild(t)
	var (
		ran     bool
		marks   []marker.Mark
		openErr error
		rows    []statestore.Reservation
	)
	statestore.AfterWrite(t, func() {
		ran = true
		marks, _ = marker.List(marker.Namespace(path))
		if openErr = os.RemoveAll(filepath.Dir(path)); openErr != nil {
			return
		}
		fresh, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if openErr = err; err != nil {
			return
		}
		defer fresh.Close()
		rows, openErr = fresh.List(ctx, statestore.Filter{Port: key.Port})
	})
	if err := s.Transfer(ctx, key, statestore.Owner{}, to); err != nil {
		t.Fatal(err)
	}
	if !ran || openErr != nil {
		t.Fatalf("the store made right after the transfer: hook ran %v, %v", ran, openErr)
	}
	for _, m := range marks {
		if m.Port == key.Port && m.PID == os.Getpid() {
			t.Errorf("right after the transfer committed, this process still had its own mark of %s: %+v", key, m)
		}
	}
	if len(rows) != 1 || !rows[0].Owner.Same(to) {
		t.Errorf("rows of %s in the new store = %v; want one, the new owner's (%v)", key, rows, to)
	}
}

// A Transfer that meets a lost file leaves the key marked, by the new
// owner's mark: a store made anew right after has the row, as the new
// owner's, where the caller hands it on. With no mark left, that store had
// no row, and granted the port while the transfer was being completed.
func TestTransferOnALostFileKeepsAMark(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	key := tcp(lo4, 24115)
	s := reservedAndMarked(t, path, statestore.Options{SweepInterval: -1}, key)
	to := liveChild(t)
	if err := os.RemoveAll(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	if err := s.Transfer(ctx, key, statestore.Owner{}, to); !errors.Is(err, statestore.ErrLost) {
		t.Fatalf("Transfer on a removed directory = %v; want ErrLost", err)
	}
	fresh := openAt(t, path)
	rows, err := fresh.List(ctx, statestore.Filter{Port: key.Port})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || !rows[0].Owner.Same(to) {
		t.Errorf("rows of %s in the store made after the failed transfer = %v; want one, the new owner's (%v)", key, rows, to)
	}
}

// A Transfer that waits for the write lock in vain while its file is lost
// (a process making the store anew holds the lock, say) reports the loss,
// wrapping ErrLost, and keeps the new owner's mark as on any lost file: the
// caller then completes the hand-off in the store made anew, which has
// the row as the new owner's.
func TestTransferLostWhileItWaited(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	key := tcp(lo4, 24117)
	s := reservedAndMarked(t, path, statestore.Options{SweepInterval: -1, BusyTimeout: 200 * time.Millisecond}, key)
	to := liveChild(t)
	lock := takeWriteLock(t, path)
	// Replaced by the lock's holder: the transfer's wait for the lock
	// times out before it could see the file change.
	replaceWithEmpty(t, path)
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := s.Transfer(tctx, key, statestore.Owner{}, to); !errors.Is(err, statestore.ErrLost) {
		t.Fatalf("Transfer whose file was replaced while it waited for the lock = %v; want ErrLost", err)
	}
	if err := lock.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	fresh := openAt(t, path)
	rows, err := fresh.List(ctx, statestore.Filter{Port: key.Port})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || !rows[0].Owner.Same(to) {
		t.Errorf("rows of %s in the store made next = %v; want one, the new owner's (%v)", key, rows, to)
	}
}

// liveChild starts a process that runs until the test ends, and returns its
// identity: an owner, other than this process, that is alive.
func liveChild(t *testing.T) statestore.Owner {
	t.Helper()
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	own, err := statestore.LookupOwner(context.Background(), child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return own
}

// reservedAndMarked opens the store at path with opts, until the test
// ends, and reserves key in it for this process, which marks it. It skips
// the test where the OS has no marks.
func reservedAndMarked(t *testing.T, path string, opts statestore.Options, key statestore.Key) *statestore.Store {
	t.Helper()
	if !marker.Supported() {
		t.Skip("no abstract unix namespace on this system")
	}
	s, err := statestore.Open(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Reserve(context.Background(), statestore.Request{Key: key}); err != nil {
		t.Fatal(err)
	}
	return s
}

// replaceWithEmpty puts an empty file in the place of the one at path, as a
// restore of an old copy or a cache does.
func replaceWithEmpty(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path+".restored", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".restored", path); err != nil {
		t.Fatal(err)
	}
}

// takeWriteLock takes the write lock of the store at path, as another
// process writing to it does, until the test ends or it is unlocked.
func takeWriteLock(t *testing.T, path string) *filelock.File {
	t.Helper()
	lock, err := filelock.Open(path + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Close() })
	if err := lock.Lock(); err != nil {
		t.Fatal(err)
	}
	return lock
}
