package portlock

import "net/netip"

// Probe reports whether network ("tcp" or "udp") port can be bound on addr
// right now, by binding a socket with the options the consumer's own
// listener will use and closing it at once: SO_REUSEADDR for TCP, as Go's
// net package sets it, and a dual-stack IPv6 socket for IPv6 addresses and
// for the IPv4 wildcard, as Go binds them. A port in use (EADDRINUSE) or
// refused (EACCES: a privileged port, a Windows excluded range) is not
// free; any other failure is an error, because it says nothing about the
// port.
func Probe(network string, addr netip.Addr, port uint16) (bool, error) {
	addr, err := check(network, addr, port)
	if err != nil {
		return false, err
	}
	return probe(network, addr, port)
}
