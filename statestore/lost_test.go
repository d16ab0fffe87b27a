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
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestCheckNoticesLoss: a store's file deleted, replaced or truncated
// under it, while another process (a holder) keeps its own connection to
// the file, is reported by Check and by the next write with an error
// wrapping ErrLost, never ErrStorage (on which a caller would fall back).
// The store never writes into the file made in its place: it goes on
// reporting the loss. A store opened at the path afterwards is a file of
// its own; a file truncated to nothing is set aside with the holder's WAL
// instead of blocking every caller on the holder's locks or reading its
// pages as the new store's.
func TestCheckNoticesLoss(t *testing.T) {
	ctx := context.Background()
	for _, loss := range []struct {
		name string
		lose func(t *testing.T, path string)
		// reopens: a store opened at the path afterwards is made anew
		// (or, for a copy, is the copy); false where what a new store
		// finds there is the damage itself.
		reopens bool
		// rows is what a store opened at the path afterwards holds.
		rows []uint16
	}{
		{"directory removed", func(t *testing.T, path string) {
			t.Helper()
			if err := os.RemoveAll(filepath.Dir(path)); err != nil {
				t.Fatal(err)
			}
		}, true, nil},
		{"file removed", func(t *testing.T, path string) {
			t.Helper()
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, true, nil},
		{"replaced by an empty file", func(t *testing.T, path string) {
			t.Helper()
			replaceWithEmpty(t, path)
		}, true, nil},
		{"replaced by a copy of itself", func(t *testing.T, path string) {
			t.Helper()
			// Every byte the same (the WAL was checkpointed), as a
			// restore of a backup taken a moment ago: only the file is
			// another.
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path+".restored", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".restored", path); err != nil {
				t.Fatal(err)
			}
		}, true, []uint16{24101, 24102, 24103}},
		{"truncated to nothing", func(t *testing.T, path string) {
			t.Helper()
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}, true, nil},
		{"truncated by a page", func(t *testing.T, path string) {
			t.Helper()
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() < 2*1024 {
				t.Fatalf("the file is %d bytes: nothing to cut a page off", fi.Size())
			}
			if err := os.Truncate(path, fi.Size()-1024); err != nil {
				t.Fatal(err)
			}
		}, false, nil},
	} {
		t.Run(loss.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state", "berth.db")
			ports, _ := json.Marshal([]uint16{24101, 24102})
			w := startWorker(t, "hold", path, "BERTH_TEST_PORTS="+string(ports))
			if e := w.next(t); e.Event != "done" {
				t.Fatalf("holder: %+v", e)
			}
			mine := openAt(t, path)
			if _, err := mine.Reserve(ctx, store.Request{Key: tcp(lo4, 24103), Label: "mine"}); err != nil {
				t.Fatal(err)
			}
			// Checked once the file has its whole size: Check compares
			// the size with the largest it has seen.
			checkpoint(t, path)
			if err := mine.Check(ctx); err != nil {
				t.Fatalf("Check before the loss = %v; want nil", err)
			}
			loss.lose(t, path)
			lost := func(when string) {
				t.Helper()
				if err := mine.Check(ctx); !errors.Is(err, store.ErrLost) {
					t.Errorf("Check %s = %v; want ErrLost", when, err)
				}
				_, err := mine.Reserve(ctx, store.Request{Key: tcp(lo4, 24104)})
				if !errors.Is(err, store.ErrLost) || errors.Is(err, store.ErrStorage) {
					t.Errorf("Reserve %s = %v; want ErrLost, not ErrStorage", when, err)
				}
				if err := mine.Release(ctx, tcp(lo4, 24103), store.Owner{}); !errors.Is(err, store.ErrLost) {
					t.Errorf("Release %s = %v; want ErrLost", when, err)
				}
				if err := mine.Remember(ctx, "mine", store.TCP, 24103); !errors.Is(err, store.ErrLost) {
					t.Errorf("Remember %s = %v; want ErrLost", when, err)
				}
			}
			lost("after the loss")
			if !loss.reopens {
				return
			}

			fresh := openAt(t, path)
			if err := fresh.Check(ctx); err != nil {
				t.Fatalf("Check of the store opened after the loss = %v; want nil", err)
			}
			var got []uint16
			for _, r := range list(t, fresh) {
				got = append(got, r.Port)
			}
			if !slices.Equal(got, loss.rows) {
				t.Errorf("ports of the store opened after the loss = %v; want %v", got, loss.rows)
			}
			if _, err := fresh.Reserve(ctx, store.Request{Key: tcp(lo4, 24105)}); err != nil {
				t.Fatalf("Reserve in the store opened after the loss = %v", err)
			}
			// The lost store still knows its file is gone, and writes
			// nothing into the new one.
			lost("once a new store is at the path")
			if rows, err := fresh.List(ctx, store.Filter{Port: 24104}); err != nil || len(rows) != 0 {
				t.Errorf("rows of 24104 in the new store = %v, %v; want none: the lost store wrote there", rows, err)
			}
			if strings.HasPrefix(loss.name, "truncated") {
				aside, _ := filepath.Glob(path + ".lost-*")
				if !slices.ContainsFunc(aside, func(p string) bool { return strings.HasSuffix(p, "-wal") }) {
					t.Errorf("files set aside = %v; want the truncated file and its WAL", aside)
				}
			}
		})
	}
}

// TestCheckQuietWhileWhole: Check says nothing of a file that only grew,
// by this store's writes, another process's, and checkpoints, nor of one
// whose WAL another connection emptied; a closed store reports ErrClosed.
func TestCheckQuietWhileWhole(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	w := startWorker(t, "hold", path, "BERTH_TEST_PORTS=[24161,24162,24163]")
	w.until(t, "done")
	for p := uint16(24000); p < 24100; p++ {
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, p), Label: strings.Repeat("l", 200)}); err != nil {
			t.Fatal(err)
		}
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	checkpoint(t, path)
	if after, err := os.Stat(path); err != nil || after.Size() <= before.Size() {
		t.Fatalf("file after a checkpoint: %v, %v; want it grown past %d bytes", after, err, before.Size())
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check of a file that grew = %v; want nil", err)
	}
	if err := s.Release(ctx, tcp(lo4, 24000), store.Owner{}); err != nil {
		t.Errorf("Release after the checkpoint = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Check after Close = %v; want ErrClosed", err)
	}
}

// checkpoint copies the WAL of the store at path into its file and empties
// it, through a connection of its own, as another process's does.
func checkpoint(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
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
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 24141)}); err != nil {
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
	_, err = s.Reserve(ctx, store.Request{Key: tcp(lo4, 24142)})
	if !errors.Is(err, store.ErrLost) || errors.Is(err, store.ErrStorage) {
		t.Fatalf("Reserve on a file truncated under the store = %v; want ErrLost, not ErrStorage", err)
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

// A Release that fails in a file that is still the store's (another
// process holds the write lock too long) reports the wait, not a loss, and
// leaves the reservation as it was. One whose file was replaced while it
// waited reports the wait too, and Check and the next write report the
// loss. One that meets a lost file reports ErrLost.
func TestReleaseFailures(t *testing.T) {
	ctx := context.Background()
	busy := statestore.Options{SweepInterval: -1, BusyTimeout: 200 * time.Millisecond}
	t.Run("write lock held", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		key := tcp(lo4, 24113)
		s := reserved(t, path, busy, key)
		lock := takeWriteLock(t, path) // another holder of the write lock
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := s.Release(tctx, key, store.Owner{}); !errors.Is(err, store.ErrBusy) || errors.Is(err, store.ErrLost) {
			t.Fatalf("Release while another holds the write lock = %v; want ErrBusy, not ErrLost", err)
		}
		if err := lock.Unlock(); err != nil {
			t.Fatal(err)
		}
		if rows, err := s.List(ctx, store.Filter{Port: key.Port}); err != nil || len(rows) != 1 || rows[0].Owner.PID != os.Getpid() {
			t.Errorf("rows of %s after a Release that failed on a held lock = %v, %v; want this process's", key, rows, err)
		}
		if err := s.Check(ctx); err != nil {
			t.Errorf("Check after a Release that failed on a held lock = %v; want nil", err)
		}
		if err := s.Release(ctx, key, store.Owner{}); err != nil {
			t.Errorf("Release once the lock is free = %v", err)
		}
	})
	t.Run("write lock held, file lost meanwhile", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		key := tcp(lo4, 24118)
		s := reserved(t, path, busy, key)
		lock := takeWriteLock(t, path) // the holder replaces the file
		replaceWithEmpty(t, path)
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := s.Release(tctx, key, store.Owner{}); err == nil {
			t.Fatal("Release while another holds the write lock = nil; want a failure")
		}
		if err := s.Check(ctx); !errors.Is(err, store.ErrLost) {
			t.Errorf("Check after the file was replaced = %v; want ErrLost", err)
		}
		if err := lock.Unlock(); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, key, store.Owner{}); !errors.Is(err, store.ErrLost) {
			t.Errorf("Release once the lock is free = %v; want ErrLost", err)
		}
	})
	t.Run("file lost", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		key := tcp(lo4, 24116)
		s := reserved(t, path, statestore.Options{SweepInterval: -1}, key)
		replaceWithEmpty(t, path)
		if err := s.Release(ctx, key, store.Owner{}); !errors.Is(err, store.ErrLost) {
			t.Fatalf("Release on a replaced file = %v; want ErrLost", err)
		}
	})
}

// A Transfer that meets a lost file reports ErrLost, for the caller to
// open the store again and complete the hand-off there. One that waits for
// the write lock in vain while its file is replaced (a process making the
// store anew holds the lock, say) reports the wait; Check and the next
// try report the loss.
func TestTransferOnALostFile(t *testing.T) {
	ctx := context.Background()
	t.Run("directory removed", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state", "berth.db")
		key := tcp(lo4, 24115)
		s := reserved(t, path, statestore.Options{SweepInterval: -1}, key)
		to := liveChild(t)
		if err := os.RemoveAll(filepath.Dir(path)); err != nil {
			t.Fatal(err)
		}
		if err := s.Transfer(ctx, key, store.Owner{}, to); !errors.Is(err, store.ErrLost) {
			t.Fatalf("Transfer on a removed directory = %v; want ErrLost", err)
		}
	})
	t.Run("replaced while it waited", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		key := tcp(lo4, 24117)
		s := reserved(t, path, statestore.Options{SweepInterval: -1, BusyTimeout: 200 * time.Millisecond}, key)
		to := liveChild(t)
		lock := takeWriteLock(t, path)
		// Replaced by the lock's holder: the transfer's wait for the lock
		// times out before it could see the file change.
		replaceWithEmpty(t, path)
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := s.Transfer(tctx, key, store.Owner{}, to); !errors.Is(err, store.ErrBusy) {
			t.Fatalf("Transfer while another holds the write lock = %v; want ErrBusy", err)
		}
		if err := s.Check(ctx); !errors.Is(err, store.ErrLost) {
			t.Errorf("Check after the file was replaced = %v; want ErrLost", err)
		}
		if err := lock.Unlock(); err != nil {
			t.Fatal(err)
		}
		if err := s.Transfer(ctx, key, store.Owner{}, to); !errors.Is(err, store.ErrLost) {
			t.Errorf("Transfer once the lock is free = %v; want ErrLost", err)
		}
	})
}

// liveChild starts a process that runs until the test ends, and returns its
// identity: an owner, other than this process, that is alive.
func liveChild(t *testing.T) store.Owner {
	t.Helper()
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	own, err := store.LookupOwner(context.Background(), child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return own
}

// reserved opens the store at path with opts, until the test ends, and
// reserves key in it for this process.
func reserved(t *testing.T, path string, opts statestore.Options, key store.Key) store.Store {
	t.Helper()
	s, err := statestore.Open(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Reserve(context.Background(), store.Request{Key: key}); err != nil {
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
