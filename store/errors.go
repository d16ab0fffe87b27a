package store

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/internal/transient"
)

// Sentinel errors. Every error a store returns for one of these conditions
// wraps the sentinel, so callers branch with errors.Is; portalloc's
// sentinels of the same meaning are these very values.
var (
	// ErrInvalid: a request field is out of its accepted values. The error
	// is a *FieldError that names the field, what was given and what is
	// accepted.
	ErrInvalid = portrange.ErrInvalid
	// ErrHeld: the port is reserved by a live owner or bound outside berth.
	// The error is a *ConflictError.
	ErrHeld = errors.New("port held")
	// ErrExhausted: no candidate port was free.
	ErrExhausted = errors.New("no free port in the range")
	// ErrNotFound: no reservation matches.
	ErrNotFound = errors.New("no such reservation")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store closed")
	// ErrDamaged: the file is not a berth database or is damaged. Open
	// refuses it and leaves it untouched.
	ErrDamaged = errors.New("not a usable berth database")
	// ErrSchemaTooNew: the database was written by a newer berth.
	ErrSchemaTooNew = errors.New("database schema is newer than this berth")
	// ErrBusy: another process kept the store locked for longer than the
	// call could wait. It is a transient condition, not damage: the store
	// works once the holder lets go. Where the OS tells who holds the
	// lock, the error names it.
	ErrBusy = errors.New("state store locked by another process")
	// ErrUnsafe: the state directory or one of berth's files in it is owned
	// by another user, may be written by others, or is a symbolic link
	// where berth creates its own file. The error says which and how to
	// fix it; nothing was opened or created.
	ErrUnsafe = safefs.ErrUnsafe
	// ErrLost: the store's file was deleted, replaced or truncated since
	// the store opened it (a cache cleaner, rm -rf, a restore), so what
	// it held is no longer where other processes look. The caller reopens
	// the store and puts back the reservations it holds; portalloc's
	// Allocator does so by itself. Rows written to a lost file are not
	// seen by anyone.
	ErrLost = errors.New("state store file lost")
	// ErrTransient: the call failed for want of something the system runs
	// short of now and then, or was interrupted: file descriptors (EMFILE,
	// ENFILE), memory (ENOMEM, SQLITE_NOMEM), disk space (ENOSPC, EDQUOT,
	// SQLITE_FULL), or a signal (EINTR, EAGAIN). The message says which and
	// what to do. Nothing is damaged: the store works again once the
	// shortage has passed, so a caller fails the call (or waits and tries
	// it again), and never falls back to a weaker backend for it, which
	// would meet the same shortage and know less. It never wraps
	// ErrStorage.
	ErrTransient = transient.ErrTransient
	// ErrStorage is wrapped by every error that comes from the database or
	// the file system rather than from the request, short of ErrBusy and
	// ErrTransient: the store could not do its job. A caller with a
	// fallback falls back on it.
	ErrStorage = errors.New("state store failed")
)

// FieldError reports refused input: a field, flag or variable whose value
// is not accepted. Every refused request, configuration, range or spec of
// berth is one (portalloc.FieldError and statestore.FieldError are other
// names of it), so a caller tests for one shape:
//
//	var fe *store.FieldError
//	if errors.As(err, &fe) { ... fe.Field, fe.Value, fe.At, fe.Want ... }
//
// and errors.Is(err, ErrInvalid) holds for it. Its fields:
//
//	Field string  what was refused as the caller wrote it: a field
//	              ("protocol", "Request.Label", "Config.Exclude[1]"), a
//	              variable ("BERTH_PORT_RANGE"), a flag, or for the
//	              argument of a parse what it parses ("port range")
//	Value string  the value or input given, as text
//	At    string  where in Value it went wrong when not the whole of it
//	              is: an item of a list (`item 2 "70000"`), an index, an
//	              offset, or a path into a document
//	              ("groups[1].ports[0].name"); empty when Value is refused
//	              whole
//	Want  string  what is accepted, and after a semicolon, where it helps,
//	              what is wrong with Value ("...; it is empty")
//
// Its message reads `Field "Value" at At: want Want`, leaving out what is
// empty; it quotes Value and cuts it after 64 bytes, so that a value from a
// file or a terminal can neither flood nor forge the message. A program
// that took the value from a flag or a variable of its own replaces Field
// in a copy before it prints the error. The type is declared in an internal
// package, the lowest that refuses input (Range.Validate returns it).
type FieldError = portrange.FieldError

// ConflictError reports a port that cannot be reserved because someone holds
// it. errors.Is(err, ErrHeld) holds for it.
type ConflictError struct {
	Key Key // what was asked for
	// Holder is the live reservation in the way. Its Owner is the zero
	// Owner when the port is bound by a process outside berth, and has
	// Scope LeaseScope when a lease holds it. Its Key
	// differs from Key when a wildcard stands in the way.
	Holder Reservation
	// Self is true when the holder is the very owner that asked, e.g. its
	// own wildcard reservation standing in the way of a specific address.
	Self bool
}

func (e *ConflictError) Error() string {
	h := e.Holder
	switch {
	case h.Owner.Scope == LeaseScope:
		return fmt.Sprintf("%s is held by lease %s through its reservation of %s%s; its holder's controller releases it, else it is free once the lease runs out", e.Key, leaseName(h.Owner.Name), h.Key, labelled(h.Label))
	case h.Owner.PID == 0:
		return fmt.Sprintf("%s is bound by a process outside berth; stop it or choose another port (ss -lnp 'sport = :%d' shows who)", e.Key, e.Key.Port)
	case e.Self && h.Key == e.Key:
		return fmt.Sprintf("%s is already reserved by this process%s", e.Key, labelled(h.Label))
	case e.Self:
		return fmt.Sprintf("%s conflicts with this process's own reservation of %s%s; release that first or choose another port", e.Key, h.Key, labelled(h.Label))
	default:
		return fmt.Sprintf("%s is held by %s through its reservation of %s%s; stop that process or choose another port", e.Key, holderName(h.Owner), h.Key, labelled(h.Label))
	}
}

// holderName names o for a message. A name read from a row of the store can
// hold anything, so one that is not plain printable text is quoted, and a
// long one is cut, so that no terminal acts on it.
func holderName(o Owner) string {
	switch {
	case o.Name == "":
		return fmt.Sprintf("pid %d", o.PID)
	case len(o.Name) > 64:
		return fmt.Sprintf("pid %d (%s...)", o.PID, strconv.Quote(o.Name[:64]))
	case strconv.CanBackquote(o.Name):
		return fmt.Sprintf("pid %d (%s)", o.PID, o.Name)
	default:
		return fmt.Sprintf("pid %d (%s)", o.PID, strconv.Quote(o.Name))
	}
}

// leaseName quotes a lease holder's name for a message, cut like
// holderName's.
func leaseName(name string) string {
	if len(name) > 64 {
		return strconv.Quote(name[:64]) + "..."
	}
	return strconv.Quote(name)
}

func labelled(label string) string {
	if label == "" {
		return ""
	}
	return fmt.Sprintf(" (label %q)", label)
}

// Is reports whether target is ErrHeld.
func (e *ConflictError) Is(target error) bool { return target == ErrHeld }
