//go:build linux

package probe

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// available binds with plain syscalls: socket, setsockopt, bind, close. That
// is a fraction of what net.Listen costs, and probes run inside the write
// transaction of every allocation.
func available(network string, addr netip.Addr, port uint16) (bool, error) {
	typ := unix.SOCK_STREAM
	if network == "udp" {
		typ = unix.SOCK_DGRAM
	}
	var (
		family int
		sa     unix.Sockaddr
	)
	if addr.Is4() && !addr.IsUnspecified() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(port), Addr: addr.As4()}
	} else {
		// IPv6 addresses and the IPv4 wildcard are probed as dual-stack IPv6
		// sockets, as Go listens on them: that socket collides with every
		// socket the consumer's own could collide with.
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(port), Addr: addr.As16()}
		if addr.Is4() {
			sa = &unix.SockaddrInet6{Port: int(port)}
		}
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if errors.Is(err, unix.EAFNOSUPPORT) && addr.Is4() {
		// A host without IPv6 binds the IPv4 wildcard as IPv4.
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(port)}
		fd, err = unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return false, fmt.Errorf("probe: socket: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	if typ == unix.SOCK_STREAM {
		// Go's listeners set SO_REUSEADDR, so a port whose last connection
		// lingers in TIME_WAIT is usable by the consumer and must probe free.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return false, fmt.Errorf("probe: SO_REUSEADDR: %w", err)
		}
	}
	if family == unix.AF_INET6 {
		// Dual-stack, the default of Go and of Linux (bindv6only=0), set
		// explicitly so a host that defaults to V6ONLY probes the same way.
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return false, fmt.Errorf("probe: IPV6_V6ONLY: %w", err)
		}
	}
	err = unix.Bind(fd, sa)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EADDRINUSE), errors.Is(err, unix.EACCES):
		return false, nil
	default:
		return false, fmt.Errorf("probe: bind %s: %w", netip.AddrPortFrom(addr, port), err)
	}
}
