package statestore

import (
	"errors"
	"fmt"
	"syscall"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/store"
)

// storageErr puts an error of the database or the file system into the
// store's words: store.ErrBusy, ErrTransient, or else ErrStorage.
func storageErr(op string, err error) error {
	switch {
	case errors.Is(err, store.ErrBusy), errors.Is(err, store.ErrTransient):
		return fmt.Errorf("%s: %w", op, err) // waiting, not failing
	case isBusy(err) || sqliteCode(err) == sqlite3.SQLITE_LOCKED:
		return fmt.Errorf("%s: the database is locked by another process (%w): %w", op, err, store.ErrBusy)
	}
	if short := shortage(err, ""); short != nil {
		return fmt.Errorf("%s: %w", op, short)
	}
	return &storageError{op: op, err: err}
}

// storageError wraps store.ErrStorage and the cause, unless explain has
// found the cause to be a shortage.
type storageError struct {
	op    string
	err   error
	short error // set by explain: the cause in words of a shortage
}

func (e *storageError) Error() string {
	if e.short != nil {
		return e.op + ": " + e.short.Error()
	}
	return e.op + ": " + store.ErrStorage.Error() + ": " + e.err.Error()
}

func (e *storageError) Unwrap() []error {
	if e.short != nil {
		return []error{e.short}
	}
	return []error{store.ErrStorage, e.err}
}

// sqliteCode returns the primary result code of err's SQLite error, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() & 0xff
	}
	return 0
}

func isBusy(err error) bool { return sqliteCode(err) == sqlite3.SQLITE_BUSY }

// unreadable reports a short read of the WAL: its index (-shm) promises frames
// the WAL at the path lacks (SQLite removed it by name under live holders).
func unreadable(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_IOERR_SHORT_READ
}

// shortage returns err wrapping store.ErrTransient when it is a passing
// shortage, else nil. An open or I/O error of SQLite carries no errno: it
// counts when this process is short of descriptors now or, with dir given,
// dir's file system is full (a real failure to open leaves both to spare).
func shortage(err error, dir string) error {
	if short := transient.Wrap(err); short != nil {
		return short
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return nil
	}
	code := se.Code()
	switch code & 0xff {
	case sqlite3.SQLITE_NOMEM:
		return transient.As(syscall.ENOMEM, err)
	case sqlite3.SQLITE_FULL:
		return transient.As(syscall.ENOSPC, err)
	case sqlite3.SQLITE_IOERR:
		if code == sqlite3.SQLITE_IOERR_NOMEM {
			return transient.As(syscall.ENOMEM, err)
		}
		fallthrough
	case sqlite3.SQLITE_CANTOPEN:
		if short := transient.DescriptorsShort(); short != nil {
			no, _ := transient.Errno(short)
			return transient.As(no, err)
		}
		if dir == "" {
			return nil
		}
		if full := transient.DiskFull(dir); full != nil {
			return transient.As(syscall.ENOSPC, fmt.Errorf("%w (%s)", err, full.Error()))
		}
	}
	return nil
}
