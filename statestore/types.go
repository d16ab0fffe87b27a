package statestore

import (
	"context"

	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/store"
)

// The types a statestore shares with the rest of berth are declared once,
// in package store, and named here too.
type (
	// Protocol is the transport a port is reserved for.
	Protocol = store.Protocol
	// Kind says how a reservation was chosen.
	Kind = store.Kind
	// Key names what a reservation holds: a port of a protocol on an
	// address, in normal form (see store.Key).
	Key = store.Key
	// Owner is the identity of the process a reservation belongs to (see
	// store.Owner); the zero Owner means "this process" where a method of
	// Store takes one.
	Owner = store.Owner
	// Reservation is one row of the store.
	Reservation = store.Reservation
)

// The protocols and kinds of reservation (see package store).
const (
	TCP     = store.TCP
	UDP     = store.UDP
	Dynamic = store.Dynamic
	Static  = store.Static
)

func identity(o Owner) owner.Identity {
	return owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Scope, Name: o.Name}
}

func fromIdentity(id owner.Identity) Owner {
	return Owner{PID: id.PID, Start: id.Start, Scope: id.Scope, Name: id.Name}
}

// Self returns the identity of the calling process (see store.Self). An
// error that comes of a passing shortage (no descriptor to read /proc
// with) wraps ErrTransient.
func Self() (Owner, error) { return store.Self() }

// LookupOwner returns the identity of the live process pid, e.g. a child an
// orchestrator has just started and hands its ports to (see
// store.LookupOwner).
func LookupOwner(ctx context.Context, pid int) (Owner, error) { return store.LookupOwner(ctx, pid) }
