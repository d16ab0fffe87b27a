package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/internal/transient"
)

// The sentinel errors of berth: every error a store, an Allocator or a
// package over it returns for one of these conditions wraps the sentinel,
// so callers branch with errors.Is, whichever layer the error came from.
var (
	// ErrInvalid: refused input, a field of a request or configuration, a
	// variable or a flag outside its accepted values. The error is a
	// *FieldError that names it, what was given and what is accepted.
	ErrInvalid = errors.New("invalid request")
	// ErrHeld: the port is reserved by a live owner, locked by another
	// process, or bound outside berth. The error is a *ConflictError.
	ErrHeld = errors.New("port held")
	// ErrExhausted: no candidate port was free.
	ErrExhausted = errors.New("no free port in the range")
	// ErrNotFound: no reservation matches: released already, reaped,
	// transferred, or another owner's.
	ErrNotFound = errors.New("no such reservation")
	// ErrClosed: the store, or the Allocator, has been closed.
	ErrClosed = errors.New("closed")
	// ErrUnavailable: the store could not be used: a busy store, a passing
	// shortage, a call out of time, a store that cannot be opened. The
	// error wraps the cause, one of the sentinels below where one applies.
	ErrUnavailable = errors.New("state store unavailable")
	// ErrDamaged: the file is not a berth database, or is damaged. A store
	// refuses it and leaves it untouched.
	ErrDamaged = errors.New("not a usable berth database")
	// ErrSchemaTooNew: the database was written by a newer berth in a way
	// this one must not write to.
	ErrSchemaTooNew = errors.New("database schema is newer than this berth")
	// ErrBusy: another process kept the store locked for longer than the
	// call could wait. It passes once the holder lets go; where the system
	// tells who holds the lock, the error names it.
	ErrBusy = errors.New("state store locked by another process")
	// ErrUnsafe: the state directory or one of berth's files in it belongs
	// to another user, may be written by others, or is a symbolic link
	// where berth creates its own file. The error says which and how to
	// fix it; nothing was opened or created.
	ErrUnsafe = safefs.ErrUnsafe
	// ErrLost: the store's reservations may have gone missing under its
	// holders: its file deleted, replaced or truncated (a cache cleaner,
	// rm -rf, a restore), or a failover to a PostgreSQL standby that had
	// not received the last commits. The holders put back what they hold;
	// portalloc does so by itself.
	ErrLost = errors.New("state store lost")
	// ErrGrace: the store pauses grants after a change of its server (a
	// failover to a standby, a restart, a restore from backup), which may
	// have lost reservations whose holders have not put them back yet; a
	// holder's own reservations are accepted meanwhile (Request.Restore).
	// The pause ends once every holder the store knows of has put back
	// what it holds, or after the store's grace period at most. Nothing is
	// damaged and the request was not refused: ask again; berth never
	// falls back to a weaker backend for it.
	ErrGrace = errors.New("grants paused after a change of server")
	// ErrTransient: the system ran short of something for a while, or
	// interrupted the call: file descriptors (EMFILE, ENFILE), memory,
	// disk space (ENOSPC, EDQUOT, SQLITE_FULL), a signal (EINTR, EAGAIN).
	// The message says which and what to do. Nothing is damaged: the call
	// can be tried again once the shortage has passed, and berth never
	// falls back to a weaker backend for it.
	ErrTransient = transient.ErrTransient
	// ErrStorage is wrapped by every error that comes from the database or
	// the file system rather than from the request, short of ErrBusy and
	// ErrTransient: the store could not do its job. A caller with a
	// fallback falls back on it.
	ErrStorage = errors.New("state store failed")
)

// FieldError reports refused input: a field, flag or variable whose value
// is not accepted. Every refused request, configuration, range or spec of
// berth is one, so a caller tests for one shape:
//
//	var fe *store.FieldError
//	if errors.As(err, &fe) { ... fe.Field, fe.Value, fe.At, fe.Want ... }
//
// and errors.Is(err, ErrInvalid) holds for it. A program that took the
// value from a flag or a variable of its own replaces Field in a copy
// before it prints the error.
type FieldError struct {
	// Field names what was refused as the caller wrote it: a field
	// ("Request.Label", "Config.Exclude[1]"), a variable
	// ("BERTH_PORT_RANGE"), a flag ("--range"), or for the argument of a
	// parse what it parses ("port range").
	Field string
	// Value is the value or input given, as text.
	Value string
	// At says where in Value it went wrong when not the whole of it is: an
	// item of a list (`item 2 "70000"`), an index, or a path into a
	// document ("groups[1].ports[0].name"). Empty when Value is refused
	// whole.
	At string
	// Want says what is accepted, and after a semicolon, where it helps,
	// what is wrong with Value ("...; it is empty").
	Want string
}

// Error reads `Field "Value" at At: want Want`, leaving out what is empty.
// It quotes Value and cuts it after 64 bytes, so that a value from a file
// or a terminal can neither flood nor forge the message.
func (e *FieldError) Error() string {
	s := quote(e.Value)
	if e.Field != "" {
		s = e.Field + " " + s
	}
	if e.At != "" {
		s += " at " + e.At
	}
	if e.Want == "" {
		return s + ": not accepted"
	}
	return s + ": want " + e.Want
}

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// quote quotes s for a message, cut after 64 bytes (see FieldError.Error).
func quote(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}
	return strconv.Quote(s)
}

// ConflictError reports a port that cannot be reserved because someone
// holds it. errors.Is(err, ErrHeld) holds for it.
type ConflictError struct {
	Key Key // what was asked for
	// Holder is what stands in the way: a live reservation, whose Key
	// differs from Key when a wildcard conflicts. Its Owner is the zero
	// Owner when the port is bound by a process outside berth, or locked
	// by a process of the host whose reservation this store does not
	// record (a test helper's, another user's, another store's): then
	// PIDs names the processes that hold the lock, as far as this one may
	// see them.
	Holder Reservation
	PIDs   []int
	// Self is true when the holder is the very owner that asked, e.g. its
	// own wildcard reservation standing in the way of a specific address.
	Self bool
	// Bound is true when no reservation or lock stands in the way, but a
	// process outside berth has the port bound.
	Bound bool
}

func (e *ConflictError) Error() string {
	h := e.Holder
	switch {
	case e.Bound:
		return fmt.Sprintf("%s is bound by a process outside berth; stop it or choose another port (ss -lnp 'sport = :%d' shows who)", e.Key, e.Key.Port)
	case h.Owner.Holder != "":
		return fmt.Sprintf("%s is held by holder %s through its reservation of %s%s; its controller releases it, else it is free once the lease ends", e.Key, quote(h.Owner.Holder), h.Key, labelled(h.Label))
	case h.Owner.PID == 0:
		who := "another process of this host"
		if len(e.PIDs) > 0 {
			who = "pid " + joinInts(e.PIDs)
		}
		held := h.Key
		if !held.Addr.IsValid() {
			held = e.Key
		}
		return fmt.Sprintf("%s is locked by %s, which holds %s without a reservation in this store (a test helper, another user's or another store's berth); stop it or choose another port (berth who %d shows it)", e.Key, who, held, e.Key.Port)
	case e.Self && h.Key == e.Key:
		return fmt.Sprintf("%s is already reserved by this process%s", e.Key, labelled(h.Label))
	case e.Self:
		return fmt.Sprintf("%s conflicts with this process's own reservation of %s%s; release that first or choose another port", e.Key, h.Key, labelled(h.Label))
	default:
		return fmt.Sprintf("%s is held by %s through its reservation of %s%s; stop that process or choose another port", e.Key, processName(h.Owner), h.Key, labelled(h.Label))
	}
}

// Is reports whether target is ErrHeld.
func (e *ConflictError) Is(target error) bool { return target == ErrHeld }

// processName names o for a message. A name read from a row of a store
// can hold anything: it is quoted when it is not plain printable text,
// and cut when long, so that no terminal acts on it.
func processName(o Owner) string {
	switch {
	case o.Name == "":
		return fmt.Sprintf("pid %d", o.PID)
	case len(o.Name) > 64 || !strconv.CanBackquote(o.Name):
		return fmt.Sprintf("pid %d (%s)", o.PID, quote(o.Name))
	default:
		return fmt.Sprintf("pid %d (%s)", o.PID, o.Name)
	}
}

func labelled(label string) string {
	if label == "" {
		return ""
	}
	return " (label " + quote(label) + ")"
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
