//go:build unix

package statestore

import (
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-go/berth/store"
)

// TestStorageErrClassifies makes each kind of error for real (SQLite's
// own, on real files, and errors of the file system) and checks what
// storageErr (and classify, for the file as a whole) makes of it: a
// passing shortage wraps store.ErrTransient and never store.ErrStorage, a lock wraps
// store.ErrBusy, and a real failure, a file that cannot be opened because it is
// missing or a directory, wraps store.ErrStorage, a reason to fall back.
func TestStorageErrClassifies(t *testing.T) {
	dir := t.TempDir()
	open := func(t *testing.T, name, params string) *sql.DB {
		t.Helper()
		db, err := openDB(dsnBare(filepath.Join(dir, name)) + params)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		db.SetMaxOpenConns(1)
		return db
	}
	for _, c := range []struct {
		name string
		make func(t *testing.T) error
		want error  // the sentinel it must wrap
		not  error  // one it must not
		say  string // in the message
	}{
		{"SQLITE_FULL", func(t *testing.T) error {
			t.Helper()
			db := open(t, "full.db", "")
			if _, err := db.Exec("CREATE TABLE t(x); PRAGMA max_page_count = 3"); err != nil {
				t.Fatal(err)
			}
			_, err := db.Exec("INSERT INTO t VALUES (randomblob(100000))")
			return err
		}, store.ErrTransient, store.ErrStorage, "no space left"},
		{"SQLITE_BUSY", func(t *testing.T) error {
			t.Helper()
			a := open(t, "busy.db", "?_pragma=journal_mode(WAL)")
			if _, err := a.Exec("CREATE TABLE t(x)"); err != nil {
				t.Fatal(err)
			}
			tx, err := a.Begin()
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.Exec("INSERT INTO t VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			b := open(t, "busy.db", "?_pragma=busy_timeout(0)")
			_, err = b.Exec("INSERT INTO t VALUES (2)")
			return err
		}, store.ErrBusy, store.ErrStorage, "locked by another process"},
		{"SQLITE_CANTOPEN, no such directory", func(t *testing.T) error {
			t.Helper()
			db := open(t, "missing/x.db", "?mode=ro")
			return db.Ping()
		}, store.ErrStorage, store.ErrTransient, "unable to open"},
		{"SQLITE_CANTOPEN, a directory", func(t *testing.T) error {
			t.Helper()
			if err := os.Mkdir(filepath.Join(dir, "adir.db"), 0o700); err != nil {
				t.Fatal(err)
			}
			db := open(t, "adir.db", "")
			return db.Ping()
		}, store.ErrStorage, store.ErrTransient, "unable to open"},
		{"SQLITE_READONLY", func(t *testing.T) error {
			t.Helper()
			rw := open(t, "ro.db", "")
			if _, err := rw.Exec("CREATE TABLE t(x)"); err != nil {
				t.Fatal(err)
			}
			ro := open(t, "ro.db", "?mode=ro")
			_, err := ro.Exec("INSERT INTO t VALUES (1)")
			return err
		}, store.ErrStorage, store.ErrTransient, "readonly"},
		{"SQL error", func(t *testing.T) error {
			t.Helper()
			_, err := open(t, "sql.db", "").Exec("SELECT * FROM no_such_table")
			return err
		}, store.ErrStorage, store.ErrTransient, "no such table"},
		{"EMFILE", func(*testing.T) error {
			return &os.PathError{Op: "open", Path: "x.lock", Err: syscall.EMFILE}
		}, store.ErrTransient, store.ErrStorage, "too many open files"},
		{"ENFILE", func(*testing.T) error { return os.NewSyscallError("socket", syscall.ENFILE) }, store.ErrTransient, store.ErrStorage, "too many open files in the system"},
		{"ENOMEM", func(*testing.T) error { return syscall.ENOMEM }, store.ErrTransient, store.ErrStorage, "out of memory"},
		{"ENOSPC", func(*testing.T) error { return &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC} }, store.ErrTransient, store.ErrStorage, "no space left"},
		{"EDQUOT", func(*testing.T) error { return &os.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT} }, store.ErrTransient, store.ErrStorage, "quota"},
		{"EINTR", func(*testing.T) error { return syscall.EINTR }, store.ErrTransient, store.ErrStorage, "interrupted"},
		{"EAGAIN", func(*testing.T) error { return syscall.EAGAIN }, store.ErrTransient, store.ErrStorage, "temporarily unavailable"},
		{"EACCES", func(*testing.T) error { return &os.PathError{Op: "open", Path: "x", Err: syscall.EACCES} }, store.ErrStorage, store.ErrTransient, "permission denied"},
		{"an error from nowhere", func(*testing.T) error { return errors.New("boom") }, store.ErrStorage, store.ErrTransient, "boom"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cause := c.make(t)
			if cause == nil {
				t.Fatal("no error to classify")
			}
			got := storageErr("op", cause)
			if !errors.Is(got, c.want) || errors.Is(got, c.not) || !strings.Contains(got.Error(), c.say) || !strings.HasPrefix(got.Error(), "op: ") {
				t.Errorf("storageErr(op, %v) = %v; want it to wrap %v and not %v, saying %q after the prefix", cause, got, c.want, c.not, c.say)
			}
		})
	}
}

// TestClassifyDamage: classify calls a file that is not a database
// damaged, never a shortage.
func TestClassifyDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "garbage.db")
	if err := os.WriteFile(path, []byte(strings.Repeat("not a database ", 300)), 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := openDB(dsnBare(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, cause := tableNames(t.Context(), db)
	got := classify(path, cause)
	if !errors.Is(got, store.ErrDamaged) || errors.Is(got, store.ErrTransient) || errors.Is(got, store.ErrStorage) {
		t.Errorf("classify(%s, %v) = %v; want store.ErrDamaged only", path, cause, got)
	}
}
