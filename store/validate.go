package store

import (
	"context"
	"fmt"
	"math"

	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/internal/transient"
)

// Request validation, written once for every store: a store checks a
// request with these before it touches its database, so the same request
// is refused the same way, with the same *FieldError, by each of them.

// DefaultBatch is the Batch of a ScanRequest whose Batch is zero.
const DefaultBatch = 32

// Checked is a request as a store records it, validated and completed by
// CheckRequest or CheckScan.
type Checked struct {
	// Key is the request's key in normal form (see Key.Normalize); a
	// scan's has Port 1, the scan sets it.
	Key Key
	// Owner is the request's owner: the store's own process for a zero
	// Owner.
	Owner Owner
	// Kind is the request's kind: Static for a Reserve, Dynamic for a
	// scan, when zero.
	Kind Kind
	// Batch is a scan's ScanRequest.Batch, DefaultBatch when zero.
	Batch int
}

// CheckRequest validates req for Reserve and completes it: its Key in
// normal form, a zero Owner made self (the store's own process), a zero
// Kind Static. An owner under a lease (Owner.IsLease) passes as it is: a
// store's lease calls make such requests, and its Reserve refuses them
// before with CheckProcessOwner. Any other owner must pass CheckOwner, and
// the label CheckLabel. A refused field is a *FieldError naming it.
func CheckRequest(req Request, self Owner) (Checked, error) {
	return check(req.Key, req.Owner, req.Kind, Static, req.Label, self)
}

// CheckScan validates req for Scan and ScanBlock as CheckRequest does for
// Reserve: its Next must be set, its key is its Protocol and Addr with
// Port 1, a zero Kind is Dynamic and a zero (or negative) Batch
// DefaultBatch.
func CheckScan(req ScanRequest, self Owner) (Checked, error) {
	if req.Next == nil {
		return Checked{}, &FieldError{Field: "next", Value: "nil", Want: "a candidate iterator"}
	}
	c, err := check(Key{Protocol: req.Protocol, Addr: req.Addr, Port: 1}, req.Owner, req.Kind, Dynamic, req.Label, self)
	if err != nil {
		return Checked{}, err
	}
	c.Batch = req.Batch
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	return c, nil
}

// CheckBlock refuses a ScanBlock of n ports unless 1 <= n <= MaxBlock.
func CheckBlock(n int) error {
	if n < 1 || n > MaxBlock {
		return &FieldError{Field: "n", Value: fmt.Sprint(n), Want: fmt.Sprintf("a block of 1 to %d ports", MaxBlock)}
	}
	return nil
}

func check(k Key, own Owner, kind, defKind Kind, label string, self Owner) (Checked, error) {
	key, err := k.Normalize()
	if err != nil {
		return Checked{}, err
	}
	switch {
	case own.IsZero():
		own = self
	case own.IsLease():
		// Checked by the lease's own calls.
	default:
		if err := CheckOwner(own); err != nil {
			return Checked{}, err
		}
	}
	switch kind {
	case "":
		kind = defKind
	case Dynamic, Static:
	default:
		return Checked{}, &FieldError{Field: "kind", Value: string(kind), Want: `"dynamic" or "static"`}
	}
	if err := CheckLabel(label); err != nil {
		return Checked{}, err
	}
	return Checked{Key: key, Owner: own, Kind: kind}, nil
}

// CheckOwner returns nil for the identity of a process that a store can
// record as an owner: a pid of 1 to 2^31-1 (what every OS hands out, and
// what PostgreSQL's integer column holds) with a start time or a scope, as
// Self and LookupOwner return it. Otherwise it returns a *FieldError for
// "owner".
func CheckOwner(o Owner) error {
	if o.PID <= 0 || o.PID > math.MaxInt32 || (o.Start == 0 && o.Scope == "") {
		return &FieldError{Field: "owner", Value: fmt.Sprintf("pid %d start %d", o.PID, o.Start), Want: "a live process identity from store.Self or store.LookupOwner (pid 1 to 2147483647)"}
	}
	return nil
}

// CheckProcessOwner refuses an owner under a lease (Owner.IsLease) in a
// call for processes, such as Reserve, Scan, Release or Transfer: a holder
// under a lease reserves through the lease calls of a store that has them
// (statestore's ReserveLease and ScanLease, a FleetStore's ReserveFleet).
// Any other owner, the zero one included, passes.
func CheckProcessOwner(o Owner) error {
	if o.IsLease() {
		return &FieldError{Field: "owner", Value: "lease " + o.Name, Want: "a process identity (a holder under a lease reserves through ReserveLease or ScanLease, or a fleet's ReserveFleet)"}
	}
	return nil
}

// Self returns the identity of the calling process, the owner of a
// request whose Owner is zero. An error that comes of a passing shortage
// (no descriptor to read /proc with) wraps ErrTransient.
func Self() (Owner, error) {
	id, err := owner.Self()
	if err != nil {
		if short := transient.Wrap(err); short != nil {
			err = short
		}
		return Owner{}, fmt.Errorf("identify this process: %w", err)
	}
	return fromIdentity(id), nil
}

// LookupOwner returns the identity of the live process pid, e.g. a child
// an orchestrator has just started and hands its ports to.
func LookupOwner(ctx context.Context, pid int) (Owner, error) {
	id, err := owner.Lookup(ctx, pid)
	if err != nil {
		return Owner{}, err
	}
	return fromIdentity(id), nil
}

func fromIdentity(id owner.Identity) Owner {
	return Owner{PID: id.PID, Start: id.Start, Scope: id.Scope, Name: id.Name}
}
