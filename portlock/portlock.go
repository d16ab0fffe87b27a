// Package portlock holds, for each TCP or UDP port a program reserves, a
// lock that the kernel keeps for it and frees the moment its holder dies:
// every berth process takes it, whatever store it records the reservation
// in, so no two of them are granted conflicting ports while a holder lives,
// even when the store is deleted, replaced, of another version or another
// user's.
//
// # The locks
//
// On Linux a lock is a datagram socket bound to a name in the abstract unix
// namespace (berth/1/tcp/24989/127.0.0.1): one socket at a time can hold a
// name, no file operation can remove it, and it is gone with the last
// descriptor of its socket. The abstract namespace belongs to the network
// namespace, as ports do: a container with a network of its own has its
// own ports and its own locks, one that shares the host's network shares
// both. On other systems a lock is an flock (LockFileEx on Windows) of a
// file per key in a directory every user of the host can write
// (LockDir).
//
// # The conflict rule
//
// Two locks of one protocol and port conflict when their addresses are
// equal or when either is a wildcard (0.0.0.0 or ::); two different
// specific addresses never conflict. On Linux a lock of a specific address
// holds two names, the address's own and one of eight slot names of its
// port, and then checks that the port's wildcard name is free; a wildcard
// lock holds the wildcard name and then checks that every slot of its port
// is free. Each takes its own name before it looks at the other's, so of
// two conflicting requests at least one sees the other: both may fail, never
// both succeed. A port that eight specific addresses hold already refuses
// one more.
//
// Anyone on the host can bind a name, so a lock held by a program that is
// not berth (a squatter) denies a port; it can never make berth grant one
// twice.
//
// # Owners that run no berth code
//
// A lock lives in its holder's descriptors. A reservation that belongs to a
// process that runs no berth code (the shell that ran berth get, a child
// handed a port) or to a named holder under a lease is held by a keeper: a
// small process per owner (not per port) that holds the locks it is handed
// (over a unix socket, with SCM_RIGHTS) until the owner exits, the lease
// ends or every lock is dropped. See Keeper.
//
// The functions of this package are safe for concurrent use.
package portlock

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
)

// ErrHeld is wrapped by the error of Acquire and Take when another holder
// has a lock that conflicts with the one asked for, or (Take) the port is
// bound outside berth. The error is a *HeldError.
var ErrHeld = errors.New("port locked by another holder")

// HeldError says why a lock could not be taken.
type HeldError struct {
	Network string // "tcp" or "udp"
	Addr    netip.Addr
	Port    uint16
	// In names what stands in the way: the address of a lock that
	// conflicts (Addr itself, or a wildcard), or, when a wildcard was
	// asked for, the zero Addr for "a lock of a specific address".
	In netip.Addr
	// slots is true when slots locks of specific addresses of the port
	// are held already.
	Slots bool
	// Bound is true when no lock stands in the way but the port is bound
	// by a process outside berth (Take's probe).
	Bound bool
}

func (e *HeldError) Error() string {
	key := e.Network + " " + netip.AddrPortFrom(e.Addr, e.Port).String()
	switch {
	case e.Bound:
		return key + " is bound by a process outside berth"
	case e.Slots:
		return fmt.Sprintf("%s: %d other addresses of port %d are locked already", key, slots, e.Port)
	case !e.In.IsValid():
		return fmt.Sprintf("%s is locked on a specific address of port %d", key, e.Port)
	case e.In == e.Addr:
		return key + " is locked by another holder"
	default:
		return fmt.Sprintf("%s is locked by another holder of %s", key, netip.AddrPortFrom(e.In, e.Port))
	}
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// slots is the most locks of distinct specific addresses one port can
// have at once (see the package doc).
const slots = 8 // keep in step with the package doc

// Lock is a held lock of one key. Close releases it. A Lock is safe for
// concurrent use.
type Lock struct {
	network string
	addr    netip.Addr
	port    uint16

	mu sync.Mutex // guards hs
	hs []handle   // the kernel objects held; nil once closed
}

// handle is one kernel object a lock holds: a socket bound to a name, or
// a locked file.
type handle interface {
	Close() error
	// fd is the descriptor (a Windows handle).
	fd() uintptr
}

// Acquire takes the lock of network ("tcp" or "udp") addr:port. It returns
// an error wrapping ErrHeld (a *HeldError) when a conflicting lock is held,
// by any process of the host, this one included; any other error (out of
// descriptors, say) says nothing of the port. An IPv4-mapped IPv6 address
// is taken as its IPv4 address.
func Acquire(network string, addr netip.Addr, port uint16) (*Lock, error) {
	addr, err := check(network, addr, port)
	if err != nil {
		return nil, err
	}
	hs, err := acquire(network, addr, port)
	if err != nil {
		return nil, err
	}
	return &Lock{network: network, addr: addr, port: port, hs: hs}, nil
}

// Take is Acquire followed by Probe, the grant of a port: the lock, and a
// bind that shows no process outside berth has the port. A port that is
// bound is an error wrapping ErrHeld (a *HeldError with Bound set), and no
// lock is kept.
func Take(network string, addr netip.Addr, port uint16) (*Lock, error) {
	l, err := Acquire(network, addr, port)
	if err != nil {
		return nil, err
	}
	free, err := Probe(network, l.addr, port)
	if err != nil || !free {
		_ = l.Close()
		if err == nil {
			err = &HeldError{Network: network, Addr: l.addr, Port: port, Bound: true}
		}
		return nil, err
	}
	return l, nil
}

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

// check validates a key and returns its address in normal form.
func check(network string, addr netip.Addr, port uint16) (netip.Addr, error) {
	switch {
	case network != "tcp" && network != "udp":
		return netip.Addr{}, fmt.Errorf("portlock: network %q: want \"tcp\" or \"udp\"", network)
	case !addr.IsValid() || addr.Zone() != "":
		return netip.Addr{}, fmt.Errorf("portlock: address %q: want an IPv4 or IPv6 address without a zone", addr.String())
	case port == 0:
		return netip.Addr{}, errors.New("portlock: port 0: want 1 to 65535")
	}
	return addr.Unmap(), nil
}

// Network returns "tcp" or "udp".
func (l *Lock) Network() string { return l.network }

// AddrPort returns the address and port the lock is for.
func (l *Lock) AddrPort() netip.AddrPort { return netip.AddrPortFrom(l.addr, l.port) }

func (l *Lock) String() string { return l.network + " " + l.AddrPort().String() }

// Close releases the lock: the kernel objects this process holds for it.
// Copies passed to another process (Files, a keeper) stay held there.
// Closing a closed Lock does nothing.
func (l *Lock) Close() error {
	l.mu.Lock()
	hs := l.hs
	l.hs = nil
	l.mu.Unlock()
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.Close())
	}
	return errors.Join(errs...)
}

// Files returns copies of the descriptors that hold the lock, for a child
// to inherit (exec.Cmd.ExtraFiles) or a keeper to be handed: the lock is
// held as long as any copy is open. The caller closes the files.
func (l *Lock) Files() ([]*os.File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hs == nil {
		return nil, fmt.Errorf("portlock: %s: closed", l)
	}
	var out []*os.File
	for i, h := range l.hs {
		f, err := dupFile(h, l.String()+"#"+strconv.Itoa(i))
		if err != nil {
			for _, f := range out {
				_ = f.Close()
			}
			return nil, fmt.Errorf("portlock: %s: %w", l, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// Inherit makes the descriptors that hold the lock pass through exec, for
// a process about to replace itself with another program that keeps its
// pid and so its reservations (berth run). They move to descriptors from
// 64 up, out of the way of those a program is handed from 3 up
// (LISTEN_FDS).
func (l *Lock) Inherit() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, h := range l.hs {
		n, err := inherit(h)
		if err != nil {
			return fmt.Errorf("portlock: %s: %w", l, err)
		}
		l.hs[i] = n
	}
	return nil
}

// HeldBy reports whether process pid holds a descriptor of the lock (it
// inherited one, say). It is false where that cannot be told.
func (l *Lock) HeldBy(pid int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.hs) > 0 && heldBy(pid, l.hs[0])
}

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
