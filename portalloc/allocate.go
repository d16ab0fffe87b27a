package portalloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/store"
)

// begin starts a call: the Allocator open, req valid and complete, its deadline Config.Timeout.
func (a *Allocator) begin(ctx context.Context, req Request) (context.Context, context.CancelFunc, Request, error) {
	if a.closed.Load() {
		return nil, nil, Request{}, store.ErrClosed
	}
	req, err := a.normalize(req)
	if err != nil {
		return nil, nil, Request{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, Request{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	return ctx, cancel, req, nil
}

// Allocate reserves a free port of the configured range for req and returns
// it: locked, free in the store, and bind-probed on req.Addr. With no free
// port it returns an error wrapping store.ErrExhausted; a field of req it
// refuses is a *store.FieldError.
func (a *Allocator) Allocate(ctx context.Context, req Request) (store.Reservation, error) {
	r, err := a.allocate(ctx, req, 0, probeCheck)
	if err != nil {
		return store.Reservation{}, opError("allocate", err)
	}
	return r[0], nil
}

// AllocateBlock reserves n consecutive ports of the range, a base port and
// the n-1 after it, for software configured by a base port (a node that
// listens on base, base+1 and base+2; an RTP media range). Every port of
// the block is locked, free in the store and bind-probed, and the n
// reservations are made in one transaction: all of them or none. Bases come
// in req's order, preferred bases (Request.Prefer) first; a block lies
// wholly in the range unless its base is a preferred one. The reservations
// are returned in port order and are released one by one, like any others.
// It needs the state store: the MRU file hands out single ports only.
func (a *Allocator) AllocateBlock(ctx context.Context, req Request, n int) ([]store.Reservation, error) {
	if n < 1 || n > store.MaxBlock {
		return nil, opError("allocate", &store.FieldError{Field: "n", Value: strconv.Itoa(n), Want: fmt.Sprintf("a block of 1 to %d ports (store.MaxBlock)", store.MaxBlock)})
	}
	if req.Sticky {
		return nil, opError("allocate", &store.FieldError{Field: "Request.Sticky", Value: "true", Want: "false: a block cannot be sticky; give its base port in Request.Prefer instead"})
	}
	rs, err := a.allocate(ctx, req, n, probeCheck)
	return rs, opError("allocate", err)
}

// allocate is Allocate (n 0) and AllocateBlock, with check for the bind-probe.
func (a *Allocator) allocate(ctx context.Context, req Request, n int, check func(store.Key) error) (rs []store.Reservation, err error) {
	defer func() { a.ctr.count(store.Dynamic, err) }()
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return nil, err
	}
	defer cancel()
	set := a.set
	if w := req.Within; w != (store.Range{}) {
		var out []portrange.Range
		if w.First > a.cfg.Range.First {
			out = append(out, portrange.Range{First: a.cfg.Range.First, Last: w.First - 1})
		}
		if w.Last < a.cfg.Range.Last {
			out = append(out, portrange.Range{First: w.Last + 1, Last: a.cfg.Range.Last})
		}
		set = set.Without(out...)
	}
	next, sticky := a.candidates(ctx, req, set)
	if n > 0 {
		whole := next
		next = func() (uint16, bool) {
			for {
				base, ok := whole()
				if !ok || slices.Contains(req.Prefer, base) || a.blockInSet(base, n) {
					return base, ok
				}
			}
		}
	}
	rs, err = a.h.scan(ctx, a, store.ScanRequest{
		Protocol: req.Protocol,
		Addr:     req.Addr,
		Owner:    req.owner(),
		TTL:      req.TTL,
		Label:    req.Label,
		Next:     next,
	}, n, check)
	if err != nil {
		return nil, a.callErr(ctx, err, req, n)
	}
	a.remember(ctx, req, sticky, rs[0].Port)
	for _, r := range rs {
		a.log.V(1).Info("reserved port", "reservation", r.String(), "label", r.Label, "holder", req.Holder)
	}
	return rs, nil
}

// blockInSet reports whether base..base+n-1 all lie in the candidate set.
func (a *Allocator) blockInSet(base uint16, n int) bool {
	if int(base)+n-1 > 65535 {
		return false
	}
	for i := range n {
		if !a.set.Contains(base + uint16(i)) {
			return false
		}
	}
	return true
}

// Reserve reserves the given port for req, whether or not it lies in the
// configured range. It returns a *store.ConflictError (errors.Is
// store.ErrHeld) when another process holds it, locks it or has it bound,
// or when this process holds a conflicting reservation (such as its own
// wildcard on the port); the error names the holder. Reserving a port this
// process already holds on the same address returns it again and takes
// another hold of it: the port stays reserved until every Allocator, set
// and pool of the process that holds it has released it.
func (a *Allocator) Reserve(ctx context.Context, req Request, port uint16) (r store.Reservation, err error) {
	defer func() { a.ctr.count(store.Static, err) }()
	defer func() { err = opError("reserve", err) }()
	if port == 0 {
		return store.Reservation{}, &store.FieldError{Field: "port", Value: "0", Want: "a port from 1 to 65535 (Allocate chooses a free one)"}
	}
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return store.Reservation{}, err
	}
	defer cancel()
	if err := a.excl.refuseLocal("port", port, req.AllowOSReserved); err != nil {
		return store.Reservation{}, err
	}
	key := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: port}
	r, err = a.h.reserve(ctx, a, store.Request{Key: key, Owner: req.owner(), TTL: req.TTL, Label: req.Label, Kind: store.Static}, probeCheck)
	if err != nil {
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			whoLocks(ce)
		}
		return store.Reservation{}, a.callErr(ctx, err, req, 0)
	}
	return r, nil
}

// Listen allocates a TCP port like Allocate and returns it already
// listening. The socket is bound while the port is locked, inside the
// store's transaction that records the reservation: no program, berth or
// not, can take the port in between. Close the listener before releasing
// the reservation. A listener can be handed to a child process with a
// listenfd.Handoff.
func (a *Allocator) Listen(ctx context.Context, req Request) (store.Reservation, net.Listener, error) {
	r, l, err := listenBound(ctx, a, req, store.TCP, func(ap string) (net.Listener, error) { return net.Listen("tcp", ap) })
	return r, l, opError("listen", err)
}

// ListenPacket is Listen for UDP: it returns the port bound.
func (a *Allocator) ListenPacket(ctx context.Context, req Request) (store.Reservation, net.PacketConn, error) {
	r, c, err := listenBound(ctx, a, req, store.UDP, func(ap string) (net.PacketConn, error) { return net.ListenPacket("udp", ap) })
	return r, c, opError("listen", err)
}

// listenBound allocates for req with bind as the probe, returning its socket.
func listenBound[S io.Closer](ctx context.Context, a *Allocator, req Request, proto store.Protocol, bind func(string) (S, error)) (store.Reservation, S, error) {
	var none S
	if req.Protocol == "" {
		req.Protocol = proto
	}
	if req.Protocol != proto {
		return store.Reservation{}, none, &store.FieldError{Field: "Request.Protocol", Value: string(req.Protocol), Want: fmt.Sprintf("%q here (Listen is for tcp, ListenPacket for udp)", proto)}
	}
	var sock S
	var bound bool
	rs, err := a.allocate(ctx, req, 0, func(k store.Key) error {
		if bound {
			_ = sock.Close() // bound for a grant the store then undid
			bound = false
		}
		s, err := bind(netip.AddrPortFrom(k.Addr, k.Port).String())
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
				return &store.ConflictError{Key: k, Bound: true}
			}
			return err
		}
		sock, bound = s, true
		return nil
	})
	if err != nil {
		if bound {
			_ = sock.Close()
		}
		return store.Reservation{}, none, err
	}
	return rs[0], sock, nil
}

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
	// with the full guarantee, before the range. They may lie outside
	// Config.Range (a dev server that should land on 3000 when it can). At
	// most MaxPrefer ports, none of them 0.
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

// normalize validates req, refusing with a *store.FieldError, and fills in its zero fields.
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

// owner is req's holder, or this process (the zero Owner).
func (req Request) owner() store.Owner { return store.Owner{Holder: req.Holder} }

var ephemeralWarning sync.Once

// excluded is what an Allocator leaves out besides Config.Exclude, the OS
// ephemeral range and the ports the OS keeps (Windows's excluded ranges),
// read once by New.
type excluded struct {
	local   []portrange.Range // net.ipv4.ip_local_reserved_ports
	browser bool              // the browsers' restricted ports are left out
}

// candidateSet is the range less everything left out (see Config.Exclude).
func candidateSet(cfg Config, excl excluded) (*portrange.Set, error) {
	var exclude []portrange.Range
	for _, r := range cfg.Exclude {
		exclude = append(exclude, portrange.Range(r))
	}
	rng := portrange.Range(cfg.Range)
	if !cfg.AllowEphemeralOverlap {
		eph, err := portrange.Ephemeral()
		if err != nil {
			cfg.Logger.Info("could not read the OS ephemeral port range; assuming the IANA range", "range", eph.String(), "error", err.Error())
		}
		if rng.Overlaps(eph) {
			ephemeralWarning.Do(func() {
				cfg.Logger.Info("the port range overlaps the OS ephemeral range; leaving the overlap out (set Config.AllowEphemeralOverlap or BERTH_ALLOW_EPHEMERAL_OVERLAP=true to keep it)",
					"range", cfg.Range.String(), "ephemeral", eph.String())
			})
			exclude = append(exclude, eph)
		}
	}
	reserved, err := portrange.ReservedByOS()
	if err != nil {
		cfg.Logger.Info("could not read the ports the OS reserves", "error", err.Error())
	}
	exclude = append(exclude, reserved...)
	exclude = append(exclude, excl.local...)
	if excl.browser {
		exclude = append(exclude, portrange.BrowserRestrictedRanges()...)
	}
	set := portrange.NewSet(rng, exclude...)
	if set.Len() == 0 {
		return nil, &store.FieldError{Field: "Config.Range", Value: cfg.Range.String(),
			Want: "a range with ports left after Config.Exclude, the OS ephemeral range and the ports the OS reserves; widen it (Config.Range or BERTH_PORT_RANGE), or set Config.AllowEphemeralOverlap (BERTH_ALLOW_EPHEMERAL_OVERLAP=true) to keep the overlap"}
	}
	return set, nil
}

// refuseLocal refuses port, named field, when the administrator reserves
// it, unless allow: a port of ip_local_reserved_ports is kept for other
// software, which may bind it at any time.
func (e excluded) refuseLocal(field string, port uint16, allow bool) error {
	if allow || !slices.ContainsFunc(e.local, func(r portrange.Range) bool { return r.Contains(port) }) {
		return nil
	}
	list := make([]string, len(e.local))
	for i, r := range e.local {
		list[i] = r.String()
	}
	return &store.FieldError{Field: field, Value: fmt.Sprint(port),
		Want: fmt.Sprintf("a port outside net.ipv4.ip_local_reserved_ports (%s), which the administrator keeps for other software; set Request.AllowOSReserved to take it anyway", strings.Join(list, ","))}
}

// candidates returns the walk over set in req's order, led by req's
// preferred ports and, before them, the sticky port of a sticky request as
// the store remembers it (returned too; 0 when there is none).
func (a *Allocator) candidates(ctx context.Context, req Request, set *portrange.Set) (func() (uint16, bool), uint16) {
	var it *portrange.Iter
	if req.Order == OrderLowest {
		it = set.Lowest()
	} else if seeded := scopeSeed(a.cfg.Scope, req.unscoped); seeded != nil {
		it = set.Candidates(seeded)
	} else {
		a.rngMu.Lock()
		it = set.Candidates(a.rng)
		a.rngMu.Unlock()
	}
	// The sticky port is in set, so never one the browsers refuse.
	sticky := a.stickyPort(ctx, req, set)
	prefer := req.Prefer
	if sticky != 0 {
		prefer = append([]uint16{sticky}, prefer...)
	}
	return func() (uint16, bool) {
		for len(prefer) > 0 {
			p := prefer[0]
			prefer = prefer[1:]
			if a.excl.browser && portrange.IsBrowserRestricted(p) {
				a.log.Info("skipping a preferred port that web browsers refuse to connect to (set Config.AllowBrowserRestricted or BERTH_ALLOW_BROWSER_RESTRICTED=true to allow it)", "port", p)
				continue
			}
			return p, true
		}
		return it.Next()
	}, sticky
}

// stickyPort returns the port a sticky request had last time, if still in set; else 0.
func (a *Allocator) stickyPort(ctx context.Context, req Request, set *portrange.Set) uint16 {
	s := a.h.store()
	if !req.Sticky || s == nil {
		return 0
	}
	p, ok, err := s.Recall(ctx, req.Label, req.Protocol)
	switch {
	case err != nil:
		a.log.Error(err, "could not recall the sticky port; allocating afresh", "label", req.Label)
		return 0
	case !ok:
		return 0
	case !set.Contains(p):
		a.log.Info("sticky port is outside the range now; allocating afresh", "label", req.Label, "port", p, "range", a.cfg.Range.String())
		return 0
	}
	return p
}

// remember records a sticky request's port, logging when it changed.
func (a *Allocator) remember(ctx context.Context, req Request, sticky, got uint16) {
	s := a.h.store()
	if !req.Sticky || s == nil {
		return
	}
	if sticky != 0 && sticky != got {
		a.log.Info("sticky port was not free (held or bound by another process); allocated another", "label", req.Label, "was", sticky, "now", got)
	}
	if err := s.Remember(ctx, req.Label, req.Protocol, got); err != nil {
		a.log.Error(err, "could not remember the sticky port", "label", req.Label)
	}
}
