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
	"syscall"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/store"
)

// begin starts a call: the Allocator open, req valid and complete, and the
// call's deadline, Config.Timeout.
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

// allocate is Allocate (n 0) and AllocateBlock, with check in place of the
// bind-probe.
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

// listenBound allocates for req with bind in place of the probe and returns
// the socket of the bind that succeeded.
func listenBound[S io.Closer](ctx context.Context, a *Allocator, req Request, proto store.Protocol, bind func(string) (S, error)) (store.Reservation, S, error) {
	var none S
	if req.Protocol == "" {
		req.Protocol = proto
	}
	if req.Protocol != proto {
		return store.Reservation{}, none, &store.FieldError{Field: "Request.Protocol", Value: string(req.Protocol), Want: fmt.Sprintf("%q here (Listen is for tcp, ListenPacket for udp)", proto)}
	}
	var (
		sock  S
		bound bool
	)
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
