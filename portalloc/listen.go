package portalloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
)

// Listen allocates a TCP port like Allocate and returns it already listening.
// The socket is bound inside the store transaction that records the
// reservation, so there is no moment at which the port is reserved but not
// bound, or bound but not reserved: not even a program outside berth can
// take it in between. Close the listener before releasing the reservation.
//
// A listener can be handed to a child process with a listenfd.Handoff.
func (a *Allocator) Listen(ctx context.Context, req Request) (Reservation, net.Listener, error) {
	r, l, err := listenBound(ctx, a, req, TCP, func(ap string) (net.Listener, error) { return net.Listen("tcp", ap) })
	return r, l, opError("listen", err)
}

// ListenPacket is Listen for UDP: it returns the port bound.
func (a *Allocator) ListenPacket(ctx context.Context, req Request) (Reservation, net.PacketConn, error) {
	r, c, err := listenBound(ctx, a, req, UDP, func(ap string) (net.PacketConn, error) { return net.ListenPacket("udp", ap) })
	return r, c, opError("listen", err)
}

// listenBound allocates for req with bind in place of the probe and returns
// the socket of the bind that succeeded.
func listenBound[S io.Closer](ctx context.Context, a *Allocator, req Request, proto Protocol, bind func(string) (S, error)) (Reservation, S, error) {
	var none S
	if req.Protocol == "" {
		req.Protocol = proto
	}
	if req.Protocol != proto {
		return Reservation{}, none, &FieldError{Field: "Request.Protocol", Value: string(req.Protocol), Want: fmt.Sprintf("%q here (Listen is for tcp, ListenPacket for udp)", proto)}
	}
	var (
		sock  S
		bound bool
	)
	r, err := a.allocateBound(ctx, req, func(ap netip.AddrPort) (bool, error) {
		s, err := bind(ap.String())
		if err != nil {
			return bindFailed(err)
		}
		sock, bound = s, true
		return true, nil
	})
	if err != nil {
		if bound {
			_ = sock.Close()
		}
		return Reservation{}, none, err
	}
	return r, sock, nil
}

// allocateBound is Allocate with bind in place of the probe: the first
// successful bind is kept by the caller's closure.
func (a *Allocator) allocateBound(ctx context.Context, req Request, bind func(netip.AddrPort) (bool, error)) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	return a.allocate(ctx, req, a.set, func(p uint16) (bool, error) {
		return bind(netip.AddrPortFrom(req.Addr, p))
	}, "")
}

// bindFailed sorts a bind error as the probe does: busy or forbidden means
// "try another port", anything else is an error.
func bindFailed(err error) (bool, error) {
	if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
		return false, nil
	}
	return false, err
}
