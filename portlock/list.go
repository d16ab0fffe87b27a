package portlock

import "net/netip"

// Held is a lock that processes of this host hold, as List finds it.
type Held struct {
	Network string     // "tcp" or "udp"
	Addr    netip.Addr // the zero Addr for a wildcard lock (0.0.0.0 or ::)
	Port    uint16
	// PIDs are the processes that hold a descriptor of the lock, as far as
	// this process may look into them (another user's are hidden from a
	// process that is not root); empty when none can be told.
	PIDs []int

	slot bool // a slot name, which List folds into the locks it stands for
}

// List returns the locks of this network namespace, ordered by protocol,
// port and address, with the processes that hold them: the reservations of
// every berth process on the host, those of test helpers that keep no
// record included. A process that holds a slot name of a port and no lock
// of an address of it (a program that is not berth squatting the name) is
// shown holding the port's wildcard, the lock it denies. It is for people
// to read: a lock made or dropped while it reads may be missed. Where
// locks are files (see LockDir), it returns none.
func List() ([]Held, error) { return list() }
