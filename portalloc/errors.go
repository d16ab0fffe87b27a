package portalloc

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// Sentinel errors: every error an Allocator returns for one of these
// conditions wraps the sentinel, for errors.Is. ErrRangeExhausted,
// ErrPortHeld, ErrInvalidRequest and ErrUnsafe are the very sentinels of
// package store (ErrExhausted, ErrHeld, ErrInvalid, ErrUnsafe), so an error
// from a store tests the same.
var (
	// ErrRangeExhausted: no port of the range is free.
	ErrRangeExhausted = store.ErrExhausted
	// ErrPortHeld: the port is reserved by a live process or bound outside
	// berth. The error is a *ConflictError with the detail.
	ErrPortHeld = store.ErrHeld
	// ErrInvalidRequest: a request or configuration field is out of its
	// accepted values; the message names the field and what is accepted.
	ErrInvalidRequest = store.ErrInvalid
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
	ErrUnsafe = store.ErrUnsafe
)

// ConflictError reports a port that is held: Key is what was asked for,
// Holder the live reservation in the way (its Owner is the zero Owner when
// a process outside berth has the port bound; its Key differs from Key
// when a wildcard stands in the way), and Self says the holder is this
// very process. errors.Is(err, ErrPortHeld) holds for it. It is the type
// package store declares, under this name.
type ConflictError = store.ConflictError

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
