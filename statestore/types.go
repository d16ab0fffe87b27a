package statestore

import (
	"context"
	"fmt"
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

func (p Protocol) valid() bool { return p == TCP || p == UDP }

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
// the zero address and addresses with an IPv6 zone are refused with a
// *FieldError.
type Key struct {
	Protocol Protocol
	Addr     netip.Addr
	Port     uint16
}

func (k Key) String() string {
	return string(k.Protocol) + " " + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// normalize validates k and returns it with its address in normal form.
func (k Key) normalize() (Key, error) {
	if !k.Protocol.valid() {
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

// Owner is the identity of the process a reservation belongs to. The pid is
// not enough, because the kernel reuses pids: the start as the kernel
// records it tells a pid's processes apart, and Scope (boot id and
// namespaces, on Linux) tells boots and containers apart. No part of it is
// read from the wall clock, so no clock step changes it.
//
// Owners come from Self, LookupOwner or a stored Reservation; the zero
// Owner means "this process" where a method takes one.
type Owner struct {
	PID int
	// Start is the process start as the kernel records it, compared
	// exactly: on Linux clock ticks since boot, on macOS and Windows unix
	// milliseconds. It is not a time to show; StartedAt is.
	Start int64
	Scope string // where PID and Start mean something
	Name  string // process name, for people reading listings
}

// IsZero reports whether o names no process.
func (o Owner) IsZero() bool { return o.identity().IsZero() }

// Same reports whether o and other are the same process. Names are not
// compared; starts are compared exactly.
func (o Owner) Same(other Owner) bool { return o.identity().Same(other.identity()) }

// Alive reports whether the process o names still runs. Where that cannot be
// decided (e.g. another pid namespace) it reports true, because taking a
// live owner for dead would hand its ports out twice.
func (o Owner) Alive(ctx context.Context) bool { return owner.Active(ctx, o.identity()) }

// StartedAt returns when o's process started by the wall clock as it reads
// now, for display only: a clock step moves it, so it never tells owners
// apart. It reports false when it cannot tell (e.g. an owner of another
// boot).
func (o Owner) StartedAt() (time.Time, bool) { return owner.StartedAt(o.identity()) }

func (o Owner) String() string { return o.identity().String() }

func (o Owner) identity() owner.Identity {
	return owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Scope, Name: o.Name}
}

func fromIdentity(id owner.Identity) Owner {
	return Owner{PID: id.PID, Start: id.Start, Scope: id.Scope, Name: id.Name}
}

// Self returns the identity of the calling process.
func Self() (Owner, error) {
	id, err := owner.Self()
	if err != nil {
		return Owner{}, fmt.Errorf("statestore: identify this process: %w", err)
	}
	return fromIdentity(id), nil
}

// LookupOwner returns the identity of the live process pid, e.g. a child an
// orchestrator has just started and hands its ports to.
func LookupOwner(ctx context.Context, pid int) (Owner, error) {
	id, err := owner.Lookup(ctx, pid)
	if err != nil {
		return Owner{}, fmt.Errorf("statestore: %w", err)
	}
	return fromIdentity(id), nil
}

func validOwner(o Owner) error {
	if o.PID <= 0 || (o.Start == 0 && o.Scope == "") {
		return &FieldError{Field: "owner", Value: fmt.Sprintf("pid %d start %d", o.PID, o.Start), Want: "a live process identity from Self or LookupOwner"}
	}
	return nil
}

// Reservation is one row of the store.
type Reservation struct {
	Key
	Owner   Owner
	Label   string
	Kind    Kind
	Created time.Time
}
