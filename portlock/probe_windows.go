package portlock

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// Error numbers of Winsock, which syscall does not name.
const (
	wsaeacces     = syscall.Errno(10013)
	wsaeaddrinuse = syscall.Errno(10048)
)

// probe binds through the net package.
func probe(network string, addr netip.Addr, port uint16) (bool, error) {
	ap := netip.AddrPortFrom(addr, port).String()
	var err error
	if network == "tcp" {
		var l net.Listener
		if l, err = net.Listen("tcp", ap); err == nil {
			return true, l.Close()
		}
	} else {
		var c net.PacketConn
		if c, err = net.ListenPacket("udp", ap); err == nil {
			return true, c.Close()
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EADDRINUSE, syscall.EACCES, wsaeaddrinuse, wsaeacces:
			return false, nil
		}
	}
	return false, fmt.Errorf("probe: bind %s: %w", ap, err)
}
