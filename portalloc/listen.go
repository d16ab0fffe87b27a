package portalloc

import (
	"context"
	"errors"
	"fmt"
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
// A listener can be handed to a child process with a Handoff.
func (a *Allocator) Listen(ctx context.Context, req Request) (Reservation, net.Listener, error) {
	if req.Protocol == "" {
		req.Protocol = TCP
	}
	if req.Protocol != TCP {
		return Reservation{}, nil, fmt.Errorf("%w: Listen protocol %q: want \"tcp\" (use ListenPacket for udp)", ErrInvalidRequest, req.Protocol)
	}
	var ln net.Listener
	r, err := a.allocateBound(ctx, req, func(ap netip.AddrPort) (bool, error) {
		l, err := net.Listen("tcp", ap.String())
		if err != nil {
			return bindFailed(err)
		}
		ln = l
		return true, nil
	})
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return Reservation{}, nil, err
	}
	return r, ln, nil
}

// ListenPacket is Listen for UDP: it returns the port bound.
func (a *Allocator) ListenPacket(ctx context.Context, req Request) (Reservation, net.PacketConn, error) {
	if req.Protocol == "" {
		req.Protocol = UDP
	}
	if req.Protocol != UDP {
		return Reservation{}, nil, fmt.Errorf("%w: ListenPacket protocol %q: want \"udp\"", ErrInvalidRequest, req.Protocol)
	}
	var pc net.PacketConn
	r, err := a.allocateBound(ctx, req, func(ap netip.AddrPort) (bool, error) {
		c, err := net.ListenPacket("udp", ap.String())
		if err != nil {
			return bindFailed(err)
		}
		pc = c
		return true, nil
	})
	if err != nil {
		if pc != nil {
			_ = pc.Close()
		}
		return Reservation{}, nil, err
	}
	return r, pc, nil
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
		return bind(netip.AddrPortFrom(req.Address, p))
	})
}

// bindFailed sorts a bind error as the probe does: busy or forbidden means
// "try another port", anything else is an error.
func bindFailed(err error) (bool, error) {
	if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
		return false, nil
	}
	return false, err
}
