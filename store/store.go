// Package store holds what berth's stores and its dispatcher share: the key
// of a reservation, the process that owns it, the reservation itself, and
// the errors a store reports. Each of these is declared once, here;
// statestore, pgstore and portalloc use them under the same names.
//
// # The conflict rule
//
// Two keys of the same protocol and port conflict when their addresses are
// equal or when either is a wildcard (0.0.0.0 or ::). Two different
// specific addresses never conflict, whatever their families. The IPv6
// wildcard covers IPv4 because a dual-stack socket bound to :: receives
// IPv4 traffic; the IPv4 wildcard covers IPv6 addresses because Go's
// net.Listen("tcp", "0.0.0.0:p") opens such a dual-stack socket, and on
// Linux it cannot share its port with a socket on ::1. Key.Conflicts
// decides it.
package store

import (
	"context"
	"net/netip"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/owner"
)

// Protocol is the transport a port is reserved for.
type Protocol string

// The protocols berth reserves ports for.
const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
)

// Valid reports whether p is TCP or UDP.
func (p Protocol) Valid() bool { return p == TCP || p == UDP }

// Kind says how a reservation was chosen.
type Kind string

// The kinds of reservation.
const (
	// Dynamic: berth chose the port from a range.
	Dynamic Kind = "dynamic"
	// Static: the caller asked for this very port.
	Static Kind = "static"
)

// Key names what a reservation holds: a port of a protocol on an address.
// Addresses are kept in normal form: an IPv4-mapped IPv6 address
// (::ffff:127.0.0.1) as its IPv4 address, so that one address has one key;
// Normalize refuses the zero address and addresses with an IPv6 zone.
type Key struct {
	Protocol Protocol
	Addr     netip.Addr
	Port     uint16
}

func (k Key) String() string {
	return string(k.Protocol) + " " + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// Normalize validates k and returns it with its address in normal form.
// The error is a *FieldError naming the field that is not accepted.
func (k Key) Normalize() (Key, error) {
	if !k.Protocol.Valid() {
		return Key{}, &FieldError{Field: "protocol", Value: string(k.Protocol), Want: `"tcp" or "udp"`}
	}
	if k.Port == 0 {
		return Key{}, &FieldError{Field: "port", Value: "0", Want: "a port from 1 to 65535"}
	}
	a, err := netaddr.Normalize(k.Addr)
	if err != nil {
		v := ""
		if k.Addr.IsValid() {
			v = k.Addr.String()
		}
		return Key{}, &FieldError{Field: "address", Value: v, Want: "an IPv4 or IPv6 address without a zone, e.g. 127.0.0.1, ::1, 0.0.0.0 or ::"}
	}
	k.Addr = a
	return k, nil
}

// Conflicts reports whether k and other, both in normal form, cannot be
// held by two owners at once (see the package doc for the rule).
func (k Key) Conflicts(other Key) bool {
	return k.Protocol == other.Protocol && k.Port == other.Port && netaddr.Conflicts(k.Addr, other.Addr)
}

// Owner is the identity of the process a reservation belongs to. The pid is
// not enough, because the kernel reuses pids: the start as the kernel
// records it tells a pid's processes apart, and Scope (boot id and
// namespaces, on Linux) tells boots and containers apart. No part of it is
// read from the wall clock, so no clock step changes it.
//
// Owners come from statestore.Self, statestore.LookupOwner or a stored
// Reservation; the zero Owner names no process (where a store's method
// takes one, it means "this process").
type Owner struct {
	PID int
	// Start is the process start as the kernel records it, compared
	// exactly: on Linux clock ticks since boot, on macOS and Windows unix
	// milliseconds. It is not a time to show; StartedAt is.
	Start int64
	Scope string // where PID and Start mean something
	Name  string // process name, for people reading listings
}

// LeaseScope is the Scope of an Owner that is no process but a named
// holder of a renewable lease, such as a pod of an orchestrator (pgstore's
// fleet-wide reservations) or a CI job on one host (LeaseStore): Name names
// the holder, PID and Start are 0.
// Such an owner is released by its holder's controller or when its lease
// runs out, never judged by a process table.
const LeaseScope = "lease"

// IsZero reports whether o names no process.
func (o Owner) IsZero() bool { return o.identity().IsZero() }

// IsLease reports whether o is a named holder under a lease (Scope
// LeaseScope), not a process.
func (o Owner) IsLease() bool { return o.Scope == LeaseScope }

// Same reports whether o and other are the same process. Names are not
// compared; starts are compared exactly. Owners under a lease are the same
// when their holders' names are.
func (o Owner) Same(other Owner) bool {
	if o.IsLease() || other.IsLease() {
		return o.IsLease() && other.IsLease() && o.Name == other.Name
	}
	return o.identity().Same(other.identity())
}

// Alive reports whether the process o names still runs. Where that cannot be
// decided (e.g. another pid namespace) it reports true, because taking a
// live owner for dead would hand its ports out twice. An owner under a
// lease is judged by its reservation's Expires, which an Owner does not
// carry: Alive reports true for it.
func (o Owner) Alive(ctx context.Context) bool {
	if o.IsLease() {
		return true
	}
	return owner.Active(ctx, o.identity())
}

// StartedAt returns when o's process started by the wall clock as it reads
// now, for display only: a clock step moves it, so it never tells owners
// apart. It reports false when it cannot tell (e.g. an owner of another
// boot).
func (o Owner) StartedAt() (time.Time, bool) {
	if o.IsLease() {
		return time.Time{}, false // a holder, not a process
	}
	return owner.StartedAt(o.identity())
}

func (o Owner) String() string { return o.identity().String() }

func (o Owner) identity() owner.Identity {
	return owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Scope, Name: o.Name}
}

// Reservation is one reservation a store holds.
type Reservation struct {
	Key
	Owner   Owner
	Label   string
	Kind    Kind
	Created time.Time
	// Expires is, for a reservation a named holder keeps under a lease
	// (Owner.IsLease), when the lease ends: the wall clock as read with
	// the row plus the time the lease had left, with the monotonic reading
	// of that moment, so comparing it with time.Now() in the same process
	// is immune to wall-clock steps. A lease that has ended (of another
	// boot, say) has an Expires no later than the moment it was read.
	// Zero for process owners, and for a lease this host cannot judge (of
	// another time namespace), which counts as live.
	Expires time.Time
}

// LeaseLive reports whether r is held under a lease that has not ended, by
// the process-local clock (see Expires); false for process owners.
func (r Reservation) LeaseLive() bool {
	return r.Owner.IsLease() && (r.Expires.IsZero() || time.Now().Before(r.Expires))
}
