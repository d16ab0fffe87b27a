package portalloc

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/berth-go/berth/store"
)

// Order is the order in which Allocate tries the ports of its range.
type Order string

const (
	// OrderRandom walks the range from a random port by a random stride,
	// the ports above the range's static segment first. Allocators racing
	// on one store start in different places, so they rarely want the same
	// port: the default.
	OrderRandom Order = "random"
	// OrderLowest tries the lowest port of the range first, then the next:
	// predictable ports for people who read them. Allocators racing on one
	// store all want the same low ports; the store's write lock makes them
	// take turns, and each skips the ports the others hold.
	OrderLowest Order = "lowest"
)

func (o Order) valid() bool { return o == OrderRandom || o == OrderLowest }

// Request describes the port a caller wants.
type Request struct {
	// Protocol is "tcp" (the zero value) or "udp".
	Protocol store.Protocol
	// Addr is the address the port is for; zero: 127.0.0.1. 0.0.0.0 and ::
	// are the wildcards, which take the port on every address.
	Addr netip.Addr
	// Prefer lists ports for Allocate to try first, in this order, each
	// with the full guarantee (locked, free in the store, bind-probed);
	// when none is free, Allocate goes on with the range as usual.
	// Preferred ports may lie outside Config.Range (a dev server that
	// should land on 3000 when it can). At most MaxPrefer ports, none of
	// them 0.
	Prefer []uint16
	// Order overrides Config.Order for this request.
	Order Order
	// Within narrows the range Allocate walks for this request to a part
	// of Config.Range (a pool's segment, say); zero: all of it.
	Within store.Range
	// Label is the caller's name for the port, shown in listings: at most
	// store.MaxLabelLen bytes of printable UTF-8 (see store.CheckLabel).
	Label string
	// Sticky asks Allocate for the port last handed out under Label (kept
	// in the state store across restarts; in Config.Scope, when it has
	// one) when it is free and in the range; otherwise any free port, with
	// the reason logged. It needs a Label. The MRU file remembers nothing
	// and ignores it.
	Sticky bool
	// AllowOSReserved lets Reserve, and Allocate through Prefer, take a
	// port of Linux's net.ipv4.ip_local_reserved_ports, which an
	// administrator keeps for other software: without it they refuse such
	// a port with a *store.FieldError that says so. Allocate never hands
	// one out from the range.
	AllowOSReserved bool
	// Holder makes the reservation a named holder's instead of this
	// process's, under a lease of TTL: a CI job, a development
	// environment, a service started detached, whose port must outlive the
	// process that asked. It ends with ReleaseHolder (or Release), or when
	// the lease ends unless Renew extends it. 1 to store.MaxHolderLen
	// bytes of printable UTF-8, e.g. "ci/job-4711". Such a reservation is
	// not held by the Allocator (Held and Close leave it alone); on Linux
	// its lock is held by a keeper process of the holder's (see package
	// portlock).
	Holder string
	// TTL is the lease of a Holder's reservation, from store.MinTTL to
	// store.MaxTTL; zero for this process's.
	TTL time.Duration

	unscoped string // Label before it was recorded in the scope
}

// normalize validates req and fills in its zero fields. The error is a
// *store.FieldError naming the field of Request.
func (a *Allocator) normalize(req Request) (Request, error) {
	if err := store.CheckLabel(req.Label); err != nil {
		return Request{}, named("Request.Label", err)
	}
	switch req.Protocol {
	case "":
		req.Protocol = store.TCP
	case store.TCP, store.UDP:
	default:
		return Request{}, &store.FieldError{Field: "Request.Protocol", Value: string(req.Protocol), Want: `"tcp" or "udp"`}
	}
	if !req.Addr.IsValid() {
		req.Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	if req.Addr.Zone() != "" {
		return Request{}, &store.FieldError{Field: "Request.Addr", Value: req.Addr.String(), Want: "an IPv4 or IPv6 address without a zone, such as 127.0.0.1, ::1, 0.0.0.0 or ::"}
	}
	req.Addr = req.Addr.Unmap()
	switch {
	case req.Order == "":
		req.Order = a.cfg.Order
	case !req.Order.valid():
		return Request{}, &store.FieldError{Field: "Request.Order", Value: string(req.Order), Want: `"random" or "lowest"`}
	}
	if len(req.Prefer) > MaxPrefer {
		return Request{}, &store.FieldError{Field: "Request.Prefer", Value: fmt.Sprintf("%d ports", len(req.Prefer)), Want: fmt.Sprintf("at most %d ports (MaxPrefer)", MaxPrefer)}
	}
	if i := slices.Index(req.Prefer, 0); i >= 0 {
		return Request{}, &store.FieldError{Field: fmt.Sprintf("Request.Prefer[%d]", i), Value: "0", Want: "a port from 1 to 65535"}
	}
	for i, p := range req.Prefer {
		if err := a.excl.refuseLocal(fmt.Sprintf("Request.Prefer[%d]", i), p, req.AllowOSReserved); err != nil {
			return Request{}, err
		}
	}
	if req.Within != (store.Range{}) {
		if err := req.Within.Validate(); err != nil {
			return Request{}, named("Request.Within", err)
		}
		if !a.cfg.Range.Contains(req.Within.First) || !a.cfg.Range.Contains(req.Within.Last) {
			return Request{}, &store.FieldError{Field: "Request.Within", Value: req.Within.String(), Want: fmt.Sprintf("a range inside Config.Range %s", a.cfg.Range)}
		}
	}
	if req.Holder != "" || req.TTL != 0 {
		if err := checkHolder(req.Holder); err != nil {
			return Request{}, named("Request.Holder", err)
		}
		if err := store.CheckTTL(req.TTL); err != nil {
			return Request{}, named("Request.TTL", err)
		}
	}
	if req.Sticky && req.Label == "" {
		return Request{}, &store.FieldError{Field: "Request.Label", Value: "", Want: "a label to remember the port under, which a sticky request (Request.Sticky) needs"}
	}
	req.unscoped = req.Label
	if l := scopeLabel(a.cfg.Scope, req.Label); len(l) > store.MaxLabelLen {
		return Request{}, &store.FieldError{Field: "Request.Label", Value: req.Label,
			Want: fmt.Sprintf("at most %d bytes together with the scope %q and %q (%d bytes now): a shorter label or scope", store.MaxLabelLen, a.cfg.Scope, scopeSep, len(l))}
	} else {
		req.Label = l
	}
	return req, nil
}

// owner is who req's reservation belongs to: its holder, or this process
// (the zero Owner).
func (req Request) owner() store.Owner { return store.Owner{Holder: req.Holder} }
