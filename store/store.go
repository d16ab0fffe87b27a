// Package store is the contract between berth's dispatcher (package
// portalloc) and the stores that record reservations: the key of a
// reservation, its owner, the reservation itself, the one port-range type,
// the errors every layer of berth returns, and the Store interface that
// package statestore (SQLite, one host) and package pgstore (PostgreSQL, a
// fleet of hosts) implement. Each of these is declared once, here; request
// validation is written once, here, for every store.
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
// decides it; package portlock's kernel locks follow the same rule.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/internal/transient"
)

// Protocol is the transport a port is reserved for: "tcp" or "udp", as the
// net package names them. An untyped string constant converts to it, so
// a Request may say Protocol: "udp".
type Protocol string

// The protocols berth reserves ports for.
const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
)

// Kind says how a reservation was chosen.
type Kind string

// The kinds of reservation, as Kubernetes' port allocator labels its
// metrics.
const (
	// Dynamic: berth chose the port from a range.
	Dynamic Kind = "dynamic"
	// Static: the caller asked for this very port.
	Static Kind = "static"
)

// Key names what a reservation holds: a port of a protocol on an address.
// Addresses are kept in normal form, an IPv4-mapped IPv6 address
// (::ffff:127.0.0.1) as its IPv4 address, so that one address has one key.
type Key struct {
	Protocol Protocol
	Addr     netip.Addr
	Port     uint16
}

// AddrPort is the address and port the key is for, as net.Listen takes
// it (with String).
func (k Key) AddrPort() netip.AddrPort { return netip.AddrPortFrom(k.Addr, k.Port) }

func (k Key) String() string {
	return string(k.Protocol) + " " + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// Normalize validates k and returns it with its address in normal form:
// a protocol of "tcp" or "udp", a port other than 0, an address without an
// IPv6 zone. The error is a *FieldError naming the field refused.
func (k Key) Normalize() (Key, error) {
	if k.Protocol != TCP && k.Protocol != UDP {
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

// Owner is who a reservation belongs to: a process, or a named holder.
//
// A process is known by its pid and by its start as the kernel records it,
// because the kernel reuses pids; Namespace says where the two mean
// something (on Linux the boot and the pid and time namespaces). No part
// of it is read from the wall clock, so no clock step changes it. Self and
// LookupOwner return such owners.
//
// A named holder (Holder set, PID 0) is no process: a CI job, a
// development environment, a pod, which reserves under a lease that its
// controller renews and that ends by itself. It is never judged by a
// process table.
//
// The zero Owner names no one; where a store's method takes an owner, it
// means the calling process.
type Owner struct {
	PID int
	// Start is the process start as the kernel records it, compared
	// exactly: on Linux clock ticks since boot, on macOS and Windows unix
	// milliseconds. It is not a time to show; StartedAt is.
	Start int64
	// Namespace is where PID and Start mean something.
	Namespace string
	// Name is the process name, for people reading listings.
	Name string
	// Holder names a holder under a lease instead of a process.
	Holder string
}

// IsZero reports whether o names no one.
func (o Owner) IsZero() bool { return o.Holder == "" && o.identity().IsZero() }

// Same reports whether o and other are the same owner: the same process
// (pids and starts equal, names not compared) or the same named holder.
func (o Owner) Same(other Owner) bool {
	if o.Holder != "" || other.Holder != "" {
		return o.Holder == other.Holder
	}
	return o.identity().Same(other.identity())
}

// Alive reports whether the process o names still runs. Where that cannot
// be decided (e.g. another pid namespace) it reports true, because taking
// a live owner for dead would hand its ports out twice. A named holder is
// judged by its reservation's Expires, which an Owner does not carry: Alive
// reports true for it.
func (o Owner) Alive(ctx context.Context) bool {
	if o.Holder != "" {
		return true
	}
	return owner.Active(ctx, o.identity())
}

// StartedAt returns when o's process started by the wall clock as it
// reads now, for display only: a clock step moves it, so it never tells
// owners apart. It reports false when it cannot tell (an owner of another
// boot, a named holder).
func (o Owner) StartedAt() (time.Time, bool) {
	if o.Holder != "" {
		return time.Time{}, false
	}
	return owner.StartedAt(o.identity())
}

func (o Owner) String() string {
	if o.Holder != "" {
		return "holder " + quote(o.Holder)
	}
	return o.identity().String()
}

func (o Owner) identity() owner.Identity {
	return owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Namespace, Name: o.Name}
}

func fromIdentity(id owner.Identity) Owner {
	return Owner{PID: id.PID, Start: id.Start, Namespace: id.Scope, Name: id.Name}
}

// Self returns the calling process as an Owner. An error that comes of a
// passing shortage (no descriptor to read /proc with) wraps ErrTransient.
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

// LookupOwner returns the running process pid as an Owner, e.g. a child
// an orchestrator has just started and hands its ports to. A pid that no
// process has is a *FieldError for "pid".
func LookupOwner(ctx context.Context, pid int) (Owner, error) {
	id, err := owner.Lookup(ctx, pid)
	switch {
	case errors.Is(err, owner.ErrNotRunning):
		return Owner{}, fmt.Errorf("%w: %w", &FieldError{Field: "pid", Value: fmt.Sprint(pid), Want: "the pid of a running process"}, err)
	case err != nil: // a shortage of descriptors, a call cut short: nothing of the pid
		return Owner{}, fmt.Errorf("look up pid %d: %w", pid, err)
	}
	return fromIdentity(id), nil
}

// Reservation is one reservation a store holds.
type Reservation struct {
	Key
	Owner   Owner
	Label   string
	Kind    Kind
	Created time.Time
	// Expires is, for a named holder's reservation, when its lease ends:
	// the wall clock as read with the row plus the time the lease had
	// left, with the monotonic reading of that moment, so comparing it
	// with time.Now() in the same process is immune to wall-clock steps.
	// Zero for a process's reservation, and for a lease this host cannot
	// judge (of another time namespace), which counts as live.
	Expires time.Time
}

// Live reports whether r's owner still holds it: a named holder whose
// lease has not ended, or a process that still runs (see Owner.Alive).
func (r Reservation) Live(ctx context.Context) bool {
	if r.Owner.Holder != "" {
		return r.Expires.IsZero() || time.Now().Before(r.Expires)
	}
	return r.Owner.Alive(ctx)
}
