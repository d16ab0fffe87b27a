package store

import (
	"context"
	"fmt"
	"time"
)

// Lease asks for a reservation that belongs to a named holder instead of a
// process, such as a CI job or a development environment that outlives the
// shell that asked: it lasts until its holder releases it or its TTL runs
// out, which RenewLease extends.
type Lease struct {
	// Holder names the holder: see CheckHolder for the accepted form.
	Holder string
	// TTL is how long the lease lasts from the grant or the last renewal:
	// from MinLeaseTTL to MaxLeaseTTL.
	TTL time.Duration
}

// The bounds of a lease's TTL. The upper one catches a unit mistake (hours
// for seconds) before it holds a port for years.
const (
	MinLeaseTTL = time.Second
	MaxLeaseTTL = 30 * 24 * time.Hour
)

// MaxHolderLen is the longest holder name, in bytes.
const MaxHolderLen = 255

// CheckHolder reports whether name may name a lease's holder: 1 to
// MaxHolderLen bytes of printable UTF-8 (letters, digits, punctuation,
// symbols and the ASCII space; no control characters), e.g. "ci/job-4711".
// The error is a *FieldError for the field "holder".
func CheckHolder(name string) error {
	want := fmt.Sprintf(`a holder name of 1 to %d bytes of printable UTF-8, e.g. "ci/job-4711"`, MaxHolderLen)
	if name == "" {
		return &FieldError{Field: "holder", Value: name, Want: want + "; it is empty"}
	}
	if why := labelProblem(name); why != "" || len(name) > MaxHolderLen {
		if why == "" {
			why = fmt.Sprintf("it has %d bytes", len(name))
		}
		return &FieldError{Field: "holder", Value: name, Want: want + "; " + why}
	}
	return nil
}

// CheckLeaseTTL reports whether ttl may be a lease's TTL: from MinLeaseTTL
// to MaxLeaseTTL. The error is a *FieldError for the field "ttl".
func CheckLeaseTTL(ttl time.Duration) error {
	if ttl < MinLeaseTTL || ttl > MaxLeaseTTL {
		return &FieldError{Field: "ttl", Value: ttl.String(), Want: "a duration from 1s to 720h (30 days), e.g. 8h"}
	}
	return nil
}

// Validate returns nil for a lease store.LeaseStore accepts: its holder
// passes CheckHolder and its TTL CheckLeaseTTL; otherwise their
// *FieldError.
func (l Lease) Validate() error {
	if err := CheckHolder(l.Holder); err != nil {
		return err
	}
	return CheckLeaseTTL(l.TTL)
}

// Check is Validate.
//
// Deprecated: use Validate, the name Go gives a check that returns an
// error; Check stays for the programs that call it.
func (l Lease) Check() error { return l.Validate() }

// LeaseStore is implemented by stores that keep reservations for named
// holders under a lease on one host (statestore.Store). The dispatcher
// reaches it by a type assertion on its Store; a store without it (pgstore,
// whose fleet-wide leases are its own) offers no host leases.
//
// A lease's reservation has Owner{Scope: LeaseScope, Name: holder} and its
// Expires set. It conflicts with other reservations as any reservation
// does; once its lease has ended it is reaped as the row of an exited
// process is (in a conflict, by Reap and in the background). A lease ends
// by a clock no wall-clock step moves, and with its boot.
type LeaseStore interface {
	// ReserveLease reserves req.Key for l.Holder under a lease of l.TTL;
	// req.Owner must be zero. When the holder holds exactly req.Key
	// already, its lease is set to l.TTL from now and its row returned,
	// with no probe.
	ReserveLease(ctx context.Context, req Request, l Lease) (Reservation, error)
	// ScanLease is Scan for l.Holder under a lease of l.TTL; req.Owner must
	// be zero.
	ScanLease(ctx context.Context, req ScanRequest, l Lease) (Reservation, error)
	// RenewLease sets the lease of every reservation of holder whose lease
	// has not ended to ttl from now, and returns how many there are. None
	// (the holder has no reservation, or all of its leases have ended) is
	// an error wrapping ErrNotFound: an ended lease is never revived, so a
	// port another owner may have taken since stays theirs.
	RenewLease(ctx context.Context, holder string, ttl time.Duration) (int, error)
	// ReleaseLease deletes the reservations of holder that match f
	// (OwnerPID must be 0) and returns how many; none is an error wrapping
	// ErrNotFound.
	ReleaseLease(ctx context.Context, holder string, f Filter) (int, error)
}
