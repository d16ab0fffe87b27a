package portalloc

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/mru"
	"github.com/berth-go/berth/store"
)

// DefaultRange is the range of a Config that names none, and the rest
// are sentinel errors: every error an Allocator returns for one of these
// conditions wraps the sentinel, for errors.Is. ErrRangeExhausted,
// ErrPortHeld, ErrInvalidRequest and ErrUnsafe are the very sentinels of
// package store (ErrExhausted, ErrHeld, ErrInvalid, ErrUnsafe), so an error
// from a store tests the same.
var (
	// DefaultRange is 20000-32767: below the Linux ephemeral range
	// (32768-60999) and the Windows and macOS dynamic range (49152-65535),
	// so the OS never hands one of its ports to an outgoing connection.
	DefaultRange = Range{First: 20000, Last: 32767}

	// ErrRangeExhausted: no port of the range is free (for fleet.Reserve
	// and fleet.ReserveSet: of the band, on every host).
	ErrRangeExhausted = store.ErrExhausted
	// ErrPortHeld: the port is reserved by a live process or bound outside
	// berth. The error is a *ConflictError with the detail.
	ErrPortHeld = store.ErrHeld
	// ErrInvalidRequest: a request or configuration field is out of its
	// accepted values. The error is a *FieldError (errors.As) that names
	// the field, the value, and what is accepted.
	ErrInvalidRequest = store.ErrInvalid
	// ErrStoreUnavailable: the state store could not be used. In every
	// mode a busy store (another process held its lock longer than the call
	// could wait), a passing shortage (ErrTransient) or a call that ran out
	// of time; in ModeStateStore also a store that could not be opened or
	// failed, which in ModeStateStoreWithFallback makes the MRU file serve
	// instead, as long as the MRU file can read the store to skip the
	// ports it holds: when it cannot, the call fails with this error too.
	ErrStoreUnavailable = errors.New("state store unavailable")
	// ErrTransient: the call failed for want of something the system runs
	// short of now and then, or was interrupted: file descriptors (EMFILE,
	// ENFILE), memory (ENOMEM, SQLITE_NOMEM), disk space (ENOSPC, EDQUOT,
	// SQLITE_FULL), or a signal (EINTR, EAGAIN). The message says which and
	// what to do (raise ulimit -n, free disk space). Nothing is damaged and
	// no mode falls back for it: the caller fails the call, or waits and
	// tries again. An error of the state store's wraps
	// ErrStoreUnavailable too. It is the sentinel store.ErrTransient is.
	ErrTransient = store.ErrTransient
	// ErrClosed: the Allocator has been closed.
	ErrClosed = errors.New("allocator closed")
	// ErrNotHeld: Release or Transfer of a reservation that this process
	// does not hold in the store: released already, reaped, or transferred
	// to another process. For fleet.Renew, fleet.Release and fleet.Narrow:
	// no such fleet-wide reservation of the holder's (released, its lease
	// ran out and was reaped, or it is another holder's).
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

// FieldError reports refused input: a field of a Request, Config or spec,
// or a variable, whose value is not accepted. Field names it as the caller
// wrote it (e.g. "Request.Label", "BERTH_PORT_RANGE"), Value is what was
// given, At where in it it went wrong (an item of a list; empty when the
// whole value is refused) and Want what is accepted.
// errors.Is(err, ErrInvalidRequest) holds for it. Every error of a call
// that wraps ErrInvalidRequest for refused input wraps one, so
// errors.As(err, &fe) finds it. A program that takes the value from a
// flag or a variable can name that instead of Field. It is the type
// package store declares, under this name.
type FieldError = store.FieldError

// OpError is the error of a call: of New, NewWithOpener, NewWithStore,
// OpenStore, OpenStoreWith, ParseRange, ParseRanges and the state
// directory functions, and of an Allocator's Allocate, Reserve,
// AllocateBlock, AllocateLease, ReserveLease, Renew, ReleaseHolder,
// Listen, ListenPacket, Release, Transfer, Reap and Close; and of every
// public call of the packages over an Allocator (pool, portset, fleet,
// lease, statedir, expvarmetrics), each of which builds it in one helper
// of its own ("new pool", `allocate set "dev"`). Op names the
// call, as a verb ("allocate", "reserve", "listen", "reap", "close") or a
// verb with what it acted on (`renew the leases of holder "ci/job-1"`), or
// is empty where Err names it ("release tcp 127.0.0.1:24989: ...") or the
// call is a constructor or a parse; Err says what went wrong. Its message
// is "portalloc: Op: Err" ("portalloc: Err" for an empty Op): the
// package's prefix is added once, here, and never by the code under the
// call. errors.Is and errors.As see through it to Err. A program that
// words errors for its own users (a command line whose command names the
// call already) can print Err instead.
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string {
	if e.Op == "" {
		return "portalloc: " + e.Err.Error()
	}
	return "portalloc: " + e.Op + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *OpError) Unwrap() error { return e.Err }

// opError is the error a public call returns: err in an *OpError for op,
// the one place the prefix "portalloc: " is added. nil stays nil.
func opError(op string, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Err: err}
}

// rowErr puts an error of the store's Release or Transfer of r into
// portalloc's words: one prefix, and a portalloc sentinel to test for.
func (a *Allocator) rowErr(op string, r Reservation, err error) error {
	err = a.closedErr(err)
	switch {
	case errors.Is(err, ErrClosed):
		return fmt.Errorf("%s %s: %w", op, r, ErrClosed)
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%s %s: %w (released already, reaped, or transferred)", op, r, ErrNotHeld)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s %s: %w", op, r, err)
	}
	return fmt.Errorf("%s %s: %w: %w", op, r, ErrStoreUnavailable, err)
}

// storeErr translates a state store error. It returns nil when the caller
// should go on with the MRU file: a failure of the store, not of the
// request, in the fallback mode. A busy store, a passing shortage of
// descriptors, memory or disk space, and a call out of time are never
// reasons to fall back: the store works, it only has to be waited for,
// and the MRU file reserves nothing.
func (a *Allocator) storeErr(ctx context.Context, err error, req Request) error {
	var ce *ConflictError
	switch {
	case errors.As(err, &ce):
		return ce
	case errors.Is(err, store.ErrExhausted):
		return fmt.Errorf("%s on %s in %s: %w", req.Protocol, req.Addr, a.cfg.Range, ErrRangeExhausted)
	case errors.Is(ctx.Err(), context.Canceled):
		return ctx.Err() // the caller gave up
	case ctx.Err() != nil && !isTransient(err):
		return ctx.Err()
	case errors.Is(err, ErrTransient), transient.Is(err) && errors.Is(err, store.ErrStorage):
		return transientErr(err) // the store's own shortage
	case transient.Is(err):
		return a.probeErr(err, req) // the probe's: out of sockets, say
	case isTransient(err) || ctx.Err() != nil:
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w: %w", err, ctxErr)
		}
		return fmt.Errorf("%w (gave up waiting; it is not damaged, and berth does not fall back for it): %w", ErrStoreUnavailable, err)
	case errors.Is(err, ErrUnsafe):
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err) // to fix, never to fall back for
	case errors.Is(err, store.ErrInvalid):
		return err // a *FieldError: ErrInvalidRequest is store.ErrInvalid
	case errors.Is(err, store.ErrClosed) && a.isClosed():
		return ErrClosed
	case errors.Is(err, store.ErrStorage) || errors.Is(err, store.ErrClosed) ||
		errors.Is(err, store.ErrDamaged) || errors.Is(err, store.ErrSchemaTooNew):
		if a.cfg.Mode == ModeStateStore {
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		a.fallBack(err)
		return nil
	case errors.Is(err, store.ErrLost):
		// Lost again right after a repair: the MRU file would serve without
		// knowing what the lost file held.
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	default:
		// A probe error: says nothing about the store.
		return a.probeErr(err, req)
	}
}

// transientErr is the error of a call that met a passing shortage in the
// state store: it wraps ErrStoreUnavailable and ErrTransient, and its
// message says what ran short.
func transientErr(err error) error {
	if short := transient.Wrap(err); short != nil && !errors.Is(err, ErrTransient) {
		err = short
	}
	return fmt.Errorf("%w (berth does not fall back for it): %w", ErrStoreUnavailable, err)
}

func (a *Allocator) mruErr(ctx context.Context, err error, req Request) error {
	switch {
	case errors.Is(err, mru.ErrExhausted):
		return fmt.Errorf("%s on %s in %s: %w", req.Protocol, req.Addr, a.cfg.Range, ErrRangeExhausted)
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return a.probeErr(err, req)
	}
}

// probeErr is the error of a bind probe (or of the MRU file): an address
// that is not the host's is a bad request, and a shortage of descriptors
// or memory says so and wraps ErrTransient.
func (a *Allocator) probeErr(err error, req Request) error {
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		// The system's error stays wrapped: errors.Is(err, EADDRNOTAVAIL).
		return fmt.Errorf("%w: %w", &FieldError{Field: "Request.Addr", Value: req.Addr.String(), Want: "an address of this host (or 0.0.0.0 or ::)"}, err)
	}
	if short := transient.Wrap(err); short != nil && !errors.Is(err, ErrTransient) {
		err = short
	}
	return err
}
