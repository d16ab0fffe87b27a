// Package sockets reads the sockets the operating system shows bound to
// local ports, and the processes that hold them open. Only Linux shows
// both (/proc/net/{tcp,tcp6,udp,udp6} and /proc/PID/fd); elsewhere List
// and Holders return an error wrapping errors.ErrUnsupported.
package sockets

import "net/netip"

// Socket is one socket bound to a local port, as the kernel shows it.
type Socket struct {
	Protocol string // "tcp" or "udp"
	Local    netip.AddrPort
	// Remote is the peer of a connected socket; the zero AddrPort's
	// address (0.0.0.0 or ::, port 0) for a listening or unconnected one.
	Remote netip.AddrPort
	// State is the TCP state ("LISTEN", "ESTABLISHED", ...); for UDP
	// "UNCONN" or "ESTABLISHED" (connected).
	State string
	UID   int    // the user that created the socket
	Inode uint64 // 0 for a socket no descriptor holds any more (TIME_WAIT)
}

// Process is a process that holds a socket open. Fields that cannot be
// read (the process exited meanwhile) are left at their zero value.
type Process struct {
	PID  int
	UID  int // the real user id
	Name string
	Args []string
}
