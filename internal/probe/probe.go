// Package probe tells whether a TCP or UDP port can be bound on an address
// right now.
//
// A probe binds a socket with the options the consumer's own listener will
// use (SO_REUSEADDR for TCP, as Go's net package sets it; a dual-stack IPv6
// socket for IPv6 addresses and for the IPv4 wildcard, as Go binds them) and
// closes it at once. Busy (EADDRINUSE) and forbidden
// (EACCES, e.g. a Windows excluded port range or a privileged port) both mean
// "unavailable"; any other failure is an error, because it says nothing about
// the port.
package probe

import (
	"fmt"
	"net/netip"
)

// Available reports whether network ("tcp" or "udp") port can be bound on
// addr. addr must be in normal form (see package netaddr).
func Available(network string, addr netip.Addr, port uint16) (bool, error) {
	if network != "tcp" && network != "udp" {
		return false, fmt.Errorf("probe: protocol %q: want tcp or udp", network)
	}
	if !addr.IsValid() || addr.Zone() != "" || addr.Is4In6() {
		return false, fmt.Errorf("probe: address %v: want a plain IPv4 or IPv6 address", addr)
	}
	if port == 0 {
		return false, fmt.Errorf("probe: port 0: want 1-65535")
	}
	return available(network, addr, port)
}
