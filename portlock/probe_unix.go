//go:build unix

package portlock

import (
	"fmt"
	"net/netip"
	"syscall"
)

// probe binds with plain system calls (socket, setsockopt, bind, close): a
// fraction of what net.Listen costs.
func probe(network string, addr netip.Addr, port uint16) (bool, error) {
	typ := syscall.SOCK_STREAM
	if network == "udp" {
		typ = syscall.SOCK_DGRAM
	}
	family := syscall.AF_INET6
	var sa syscall.Sockaddr = &syscall.SockaddrInet6{Port: int(port), Addr: addr.As16()}
	switch {
	case addr.Is4() && !addr.IsUnspecified():
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: int(port), Addr: addr.As4()}
	case addr.Is4():
		sa = &syscall.SockaddrInet6{Port: int(port)} // the IPv4 wildcard, dual-stack
	}
	// No process starts while the socket is open: a child holds a copy of
	// every descriptor until it execs, keeping the port bound after this.
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := syscall.Socket(family, typ, 0)
	if err == syscall.EAFNOSUPPORT && addr.Is4() {
		// A host without IPv6 binds the IPv4 wildcard as IPv4.
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: int(port)}
		fd, err = syscall.Socket(family, typ, 0)
	}
	if err != nil {
		return false, fmt.Errorf("probe: socket: %w", err)
	}
	syscall.CloseOnExec(fd)
	defer func() { _ = syscall.Close(fd) }()
	if typ == syscall.SOCK_STREAM {
		// A port whose last connection lingers in TIME_WAIT is usable by a
		// Go listener, which sets SO_REUSEADDR: it must probe free.
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			return false, fmt.Errorf("probe: SO_REUSEADDR: %w", err)
		}
	}
	if family == syscall.AF_INET6 {
		// Dual-stack, the default of Go and of Linux, set explicitly so a
		// host that defaults to IPV6_V6ONLY probes the same way.
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0); err != nil {
			return false, fmt.Errorf("probe: IPV6_V6ONLY: %w", err)
		}
	}
	switch err := syscall.Bind(fd, sa); err {
	case nil:
		return true, nil
	case syscall.EADDRINUSE, syscall.EACCES:
		return false, nil
	default:
		return false, fmt.Errorf("probe: bind %s: %w", netip.AddrPortFrom(addr, port), err)
	}
}
