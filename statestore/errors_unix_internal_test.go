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
)

// TestStorageErrClassifies makes each kind of error for real (SQLite's
// own, on real files, and errors of the file system) and checks what
// storageErr (and classify, for the file as a whole) makes of it: a
// passing shortage wraps ErrTransient and never ErrStorage, a lock wraps
// ErrBusy, and a real failure, a file that cannot be opened because it is
// missing or a directory, wraps ErrStorage, a reason to fall back.
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
		}, ErrTransient, ErrStorage, "no space left"},
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
		}, ErrBusy, ErrStorage, "locked by another process"},
		{"SQLITE_CANTOPEN, no such directory", func(t *testing.T) error {
			t.Helper()
			db := open(t, "missing/x.db", "?mode=ro")
			return db.Ping()
		}, ErrStorage, ErrTransient, "unable to open"},
		{"SQLITE_CANTOPEN, a directory", func(t *testing.T) error {
			t.Helper()
			if err := os.Mkdir(filepath.Join(dir, "adir.db"), 0o700); err != nil {
				t.Fatal(err)
			}
			db := open(t, "adir.db", "")
			return db.Ping()
		}, ErrStorage, ErrTransient, "unable to open"},
		{"SQLITE_READONLY", func(t *testing.T) error {
			t.Helper()
			rw := open(t, "ro.db", "")
			if _, err := rw.Exec("CREATE TABLE t(x)"); err != nil {
				t.Fatal(err)
			}
			ro := open(t, "ro.db", "?mode=ro")
			_, err := ro.Exec("INSERT INTO t VALUES (1)")
			return err
		}, ErrStorage, ErrTransient, "readonly"},
		{"SQL error", func(t *testing.T) error {
			t.Helper()
			_, err := open(t, "sql.db", "").Exec("SELECT * FROM no_such_table")
			return err
		}, ErrStorage, ErrTransient, "no such table"},
		{"EMFILE", func(*testing.T) error {
			return &os.PathError{Op: "open", Path: "x.lock", Err: syscall.EMFILE}
		}, ErrTransient, ErrStorage, "too many open files"},
		{"ENFILE", func(*testing.T) error { return os.NewSyscallError("socket", syscall.ENFILE) }, ErrTransient, ErrStorage, "too many open files in the system"},
		{"ENOMEM", func(*testing.T) error { return syscall.ENOMEM }, ErrTransient, ErrStorage, "out of memory"},
		{"ENOSPC", func(*testing.T) error { return &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC} }, ErrTransient, ErrStorage, "no space left"},
		{"EDQUOT", func(*testing.T) error { return &os.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT} }, ErrTransient, ErrStorage, "quota"},
		{"EINTR", func(*testing.T) error { return syscall.EINTR }, ErrTransient, ErrStorage, "interrupted"},
		{"EAGAIN", func(*testing.T) error { return syscall.EAGAIN }, ErrTransient, ErrStorage, "temporarily unavailable"},
		{"EACCES", func(*testing.T) error { return &os.PathError{Op: "open", Path: "x", Err: syscall.EACCES} }, ErrStorage, ErrTransient, "permission denied"},
		{"an error from nowhere", func(*testing.T) error { return errors.New("boom") }, ErrStorage, ErrTransient, "boom"},
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
	if !errors.Is(got, ErrDamaged) || errors.Is(got, ErrTransient) || errors.Is(got, ErrStorage) {
		t.Errorf("classify(%s, %v) = %v; want ErrDamaged only", path, cause, got)
	}
}
