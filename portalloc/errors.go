package portalloc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/berth-go/berth/statestore"
)

// Sentinel errors: every error an Allocator returns for one of these
// conditions wraps the sentinel, for errors.Is.
var (
	// ErrRangeExhausted: no port of the range is free.
	ErrRangeExhausted = errors.New("no free port in the range")
	// ErrPortHeld: the port is reserved by a live process or bound outside
	// berth. The error is a *ConflictError with the detail.
	ErrPortHeld = errors.New("port held")
	// ErrInvalidRequest: a request or configuration field is out of its
	// accepted values; the message names the field and what is accepted.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrStoreUnavailable: the state store could not be used. In every
	// mode a busy store (another process held its lock longer than the call
	// could wait) or a call that ran out of time; in ModeStateStore also a
	// store that could not be opened or failed, which in
	// ModeStateStoreWithFallback makes the MRU file serve instead.
	ErrStoreUnavailable = errors.New("state store unavailable")
	// ErrClosed: the Allocator has been closed.
	ErrClosed = errors.New("allocator closed")
	// ErrNotHeld: Release or Transfer of a reservation that this process
	// does not hold in the store: released already, reaped, or transferred
	// to another process.
	ErrNotHeld = errors.New("not held by this process")
	// ErrUnsafe: the state directory or a file of berth's in it belongs
	// to another user, may be written by others, or is a symbolic link
	// where berth creates its own file; or root's default state directory
	// would be in another user's home (see Config.StateDir). The message
	// says which and how to fix it. It is a refusal to fix, not a fault
	// to work around: no mode falls back to the MRU file for it, and New
	// returns an error wrapping both ErrUnsafe and ErrStoreUnavailable. It
	// is the sentinel statestore.ErrUnsafe and mru.ErrUnsafe are.
	ErrUnsafe = statestore.ErrUnsafe
)

// ConflictError reports a port that is held. errors.Is(err, ErrPortHeld)
// holds for it.
type ConflictError struct {
	Protocol Protocol
	Address  netip.Addr
	Port     uint16

	// HolderPID is the process holding the port; 0 when the port is bound
	// by a process outside berth.
	HolderPID  int
	HolderName string
	// HolderAddress is the address of the holder's reservation, which
	// differs from Address when a wildcard stands in the way.
	HolderAddress netip.Addr
	HolderLabel   string
	// Self is true when the holder is this very process, e.g. its own
	// wildcard reservation of the port.
	Self bool
}

func (e *ConflictError) Error() string {
	want := fmt.Sprintf("%s %s", e.Protocol, netip.AddrPortFrom(e.Address, e.Port))
	holder := fmt.Sprintf("%s %s", e.Protocol, netip.AddrPortFrom(e.HolderAddress, e.Port))
	label := ""
	if e.HolderLabel != "" {
		label = fmt.Sprintf(" (label %q)", e.HolderLabel)
	}
	switch {
	case e.HolderPID == 0:
		return fmt.Sprintf("%s is bound by a process outside berth; stop it or choose another port", want)
	case e.Self && e.HolderAddress == e.Address:
		return fmt.Sprintf("%s is already reserved by this process%s", want, label)
	case e.Self:
		return fmt.Sprintf("%s conflicts with this process's own reservation of %s%s; release that first or choose another port", want, holder, label)
	default:
		name := ""
		switch {
		case labelProblem(e.HolderName) != "":
			// A name from a row of the store can hold anything.
			name = " (" + quoteShort(e.HolderName) + ")"
		case e.HolderName != "":
			name = " (" + e.HolderName + ")"
		}
		return fmt.Sprintf("%s is held by pid %d%s through its reservation of %s%s; stop that process or choose another port", want, e.HolderPID, name, holder, label)
	}
}

// Is reports whether target is ErrPortHeld.
func (e *ConflictError) Is(target error) bool { return target == ErrPortHeld }

func fromStoreConflict(ce *statestore.ConflictError) *ConflictError {
	h := ce.Holder
	return &ConflictError{
		Protocol:      Protocol(ce.Key.Protocol),
		Address:       ce.Key.Addr,
		Port:          ce.Key.Port,
		HolderPID:     h.Owner.PID,
		HolderName:    h.Owner.Name,
		HolderAddress: h.Addr,
		HolderLabel:   h.Label,
		Self:          ce.Self,
	}
}

// rowErr puts an error of the store's Release or Transfer of r into
// portalloc's words: one prefix, and a portalloc sentinel to test for.
func (a *Allocator) rowErr(op string, r Reservation, err error) error {
	err = a.closedErr(err)
	switch {
	case errors.Is(err, ErrClosed):
		return fmt.Errorf("portalloc: %s %s: %w", op, r, ErrClosed)
	case errors.Is(err, statestore.ErrNotFound):
		return fmt.Errorf("portalloc: %s %s: %w (released already, reaped, or transferred)", op, r, ErrNotHeld)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("portalloc: %s %s: %w", op, r, err)
	}
	return fmt.Errorf("portalloc: %s %s: %w: %w", op, r, ErrStoreUnavailable, err)
}
