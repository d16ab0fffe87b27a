package portalloc

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	shortage "github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/store"
)

// OpError is the error of a public call of portalloc and of the packages
// over it: Op names the call, as a verb ("allocate", "reserve", "close") or
// a verb with what it acted on ("release tcp 127.0.0.1:24989"), or is
// empty for a constructor; Err says what went wrong, wrapping the
// sentinels of package store. Its message is "portalloc: Op: Err": the
// prefix is added once, here, never by the code under the call. A program
// that words errors for its own users (a command whose name says the call
// already) can print Err instead.
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

// opError is the error a public call returns: err in an *OpError for op.
// nil stays nil, and an *OpError is not wrapped again.
func opError(op string, err error) error {
	var oe *OpError
	if err == nil || errors.As(err, &oe) {
		return err
	}
	return &OpError{Op: op, Err: err}
}

// transient reports whether err means "wait", not "broken": a busy store,
// a passing shortage (store.ErrTransient, or the errno of one), a call out
// of time. None is a reason to fall back.
func transient(err error) bool {
	return errors.Is(err, store.ErrBusy) || errors.Is(err, context.DeadlineExceeded) || shortage.Is(err)
}

// callErr puts an error of a grant in portalloc's words: a conflict and
// refused input as they are; an exhausted range naming the range; a
// shortage saying what ran short (wrapping store.ErrTransient); a store
// that could not be used wrapping store.ErrUnavailable.
func (a *Allocator) callErr(ctx context.Context, err error, req Request, n int) error {
	var ce *store.ConflictError
	switch {
	case errors.As(err, &ce), errors.Is(err, store.ErrInvalid), errors.Is(err, store.ErrClosed):
		return err
	case errors.Is(err, store.ErrExhausted):
		what := req.Protocol + " port"
		if n > 1 {
			what = store.Protocol(fmt.Sprintf("block of %d %s ports", n, req.Protocol))
		}
		return fmt.Errorf("no free %s on %s in %s: %w", what, req.Addr, a.cfg.Range, err)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		// The system's error stays wrapped: errors.Is(err, EADDRNOTAVAIL).
		return fmt.Errorf("%w: %w", &store.FieldError{Field: "Request.Addr", Value: req.Addr.String(), Want: "an address of this host (or 0.0.0.0 or ::)"}, err)
	case errors.Is(ctx.Err(), context.Canceled):
		return ctx.Err() // the caller gave up
	case errors.Is(err, store.ErrUnavailable):
		return err
	case transient(err) || ctx.Err() != nil:
		if short := shortage.Wrap(err); short != nil && !errors.Is(err, store.ErrTransient) {
			err = short
		}
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w: %w", err, ctxErr)
		}
		return fmt.Errorf("%w (it is not damaged, and berth does not fall back for it): %w", store.ErrUnavailable, err)
	case errors.Is(err, store.ErrStorage), errors.Is(err, store.ErrDamaged), errors.Is(err, store.ErrSchemaTooNew),
		errors.Is(err, store.ErrLost), errors.Is(err, store.ErrUnsafe):
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}
