package statestore

import (
	"errors"
	"fmt"

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
	// ErrStorage is wrapped by every error that comes from the database or
	// the file system rather than from the request: the store could not do
	// its job. A caller with a fallback falls back on it.
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

func storageErr(op string, err error) error {
	if errors.Is(err, ErrBusy) {
		return fmt.Errorf("%s: %w", op, err) // waiting, not failing
	}
	return fmt.Errorf("%s: %w: %w", op, ErrStorage, err)
}
