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

// Sentinel errors, declared in package store and named here too. Every
// error the store returns for one of these conditions wraps the sentinel,
// so callers branch with errors.Is.
var (
	// ErrInvalid: a request field is out of its accepted values. The error
	// is a *FieldError that names the field.
	ErrInvalid = store.ErrInvalid
	// ErrHeld: the port is reserved by a live owner or bound outside berth.
	// The error is a *ConflictError.
	ErrHeld = store.ErrHeld
	// ErrExhausted: a scan ran out of candidates without finding a free port.
	ErrExhausted = store.ErrExhausted
	// ErrNotFound: no reservation matches.
	ErrNotFound = store.ErrNotFound
	// ErrClosed: the store has been closed.
	ErrClosed = store.ErrClosed
	// ErrDamaged: the file is not a berth database or is damaged. Open
	// refuses it and leaves it untouched.
	ErrDamaged = store.ErrDamaged
	// ErrSchemaTooNew: the database was written by a newer berth.
	ErrSchemaTooNew = store.ErrSchemaTooNew
	// ErrBusy: another process kept the store locked for longer than the
	// call could wait (its context or the store's BusyTimeout). It is a
	// transient condition, not damage: the store works once the holder
	// lets go. Where the OS tells who holds the lock, the error names it.
	ErrBusy = store.ErrBusy
	// ErrUnsafe: the state directory or one of berth's files in it is owned
	// by another user, may be written by others, or is a symbolic link
	// where berth creates its own file. The error says which and how to
	// fix it; nothing was opened or created.
	ErrUnsafe = store.ErrUnsafe
	// ErrLost: the database file was deleted, replaced or truncated since
	// Open: reopen the store and put back what you hold (see store.ErrLost).
	ErrLost = store.ErrLost
	// ErrTransient: the call failed for want of file descriptors, memory
	// or disk space, or was interrupted; the message says which and what to
	// do (see store.ErrTransient). It is not damage and never wraps
	// ErrStorage: a caller with a fallback does not fall back for it.
	ErrTransient = store.ErrTransient
	// ErrStorage is wrapped by every error that comes from the database or
	// the file system rather than from the request, short of ErrBusy and
	// ErrTransient: the store could not do its job. A caller with a
	// fallback falls back on it.
	ErrStorage = store.ErrStorage
)

type (
	// FieldError reports a request field whose value is not accepted (see
	// store.FieldError).
	FieldError = store.FieldError
	// ConflictError reports a port that cannot be reserved because someone
	// holds it (see store.ConflictError). errors.Is(err, ErrHeld) holds for
	// it.
	ConflictError = store.ConflictError
)

// storageErr puts an error of the database or the file system into the
// store's words: a lock to wait for (ErrBusy), a passing shortage
// (ErrTransient), or else a failure of the store (ErrStorage). op prefixes
// the message.
func storageErr(op string, err error) error {
	switch {
	case errors.Is(err, ErrBusy), errors.Is(err, ErrTransient):
		return fmt.Errorf("%s: %w", op, err) // waiting, not failing
	case isLocked(err):
		return fmt.Errorf("%s: the database is locked by another process (%w): %w", op, err, ErrBusy)
	}
	if short := shortage(err, ""); short != nil {
		return fmt.Errorf("%s: %w", op, short)
	}
	return &storageError{op: op, err: err}
}

// shortErr prefixes err with op and, when it comes of a passing shortage
// (an errno of one), puts it in the words of one, wrapping ErrTransient;
// any other error it leaves as it is.
func shortErr(op string, err error) error {
	if short := transient.Wrap(err); short != nil {
		err = short
	}
	return fmt.Errorf("%s: %w", op, err)
}

// storageError is a failure of the store: it wraps ErrStorage and the
// cause, unless explain has found the cause to be a full disk (short).
type storageError struct {
	op    string
	err   error
	short error // set by explain: the cause in words of a shortage
}

func (e *storageError) Error() string {
	if e.short != nil {
		return e.op + ": " + e.short.Error()
	}
	return e.op + ": " + ErrStorage.Error() + ": " + e.err.Error()
}

func (e *storageError) Unwrap() []error {
	if e.short != nil {
		return []error{e.short}
	}
	return []error{ErrStorage, e.err}
}

// isLocked reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED, in
// any of their extended forms.
func isLocked(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code() & 0xff
	return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
}

// shortage returns err in the words of a passing shortage (wrapping
// ErrTransient) when that is what it is, else nil: an error number of a
// shortage anywhere in err; SQLite's SQLITE_NOMEM and SQLITE_FULL; and an
// open or I/O error of SQLite, which carries no errno, when this process
// is short of descriptors now or, with dir given, the file system of dir
// is full. A real failure to open (no such directory, no permission, a
// directory where the file should be) leaves descriptors and space to
// spare and stays a failure.
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
