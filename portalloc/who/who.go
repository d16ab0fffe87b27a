// Package who tells who holds a port: berth's reservations of it, the
// kernel locks berth processes hold for it, and every process the
// operating system shows bound to it, berth's or not, with its pid, user,
// name and command line. It answers the question behind "address already
// in use".
//
// Only Linux shows which process binds a port (/proc/net/tcp, tcp6, udp,
// udp6, matched to the socket inodes in /proc/PID/fd). On other systems a
// Report still carries berth's reservations, and its SocketsErr says that
// the system cannot tell the rest (it wraps errors.ErrUnsupported).
//
// A process may read the descriptors of its own user's processes only,
// unless it is root: a socket of another user's process is reported with
// the user the kernel records for it, and no process.
package who

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"slices"
	"strconv"
	"syscall"

	"github.com/berth-go/berth/internal/sockets"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// Report is what Lookup found out about one port.
type Report struct {
	Port uint16
	// Reservations are berth's reservations of the port, of either
	// protocol and any address.
	Reservations []Reservation
	// Sockets are the sockets the system shows bound to the port, of
	// either protocol, listening or connected, in the order the system
	// lists them. Sockets no process holds any more (TIME_WAIT) are left
	// out.
	Sockets []Socket
	// SocketsErr is nil when Sockets lists every such socket; otherwise it
	// says why the system could not tell (wrapping errors.ErrUnsupported
	// on systems other than Linux).
	SocketsErr error
	// Locks are berth's kernel locks of the port held on this host (see
	// package portlock), with the processes that hold them: those of every
	// live berth reservation, and those of holders a store does not show
	// (a test helper's, another user's berth, a store other than s). A
	// lock held by a keeper process names the keeper.
	Locks []Lock
}

// Lock is a kernel lock of a port.
type Lock struct {
	Protocol store.Protocol
	// Addr is the address locked; the zero Addr for a wildcard (0.0.0.0
	// or ::), which locks the port on every address.
	Addr netip.Addr
	// Processes hold the lock: empty when none can be seen (another
	// user's, and the caller is not root).
	Processes []Process
}

// Reservation is one of berth's reservations of a port.
type Reservation struct {
	store.Reservation
	// Alive reports whether its owner runs (or, for a named holder, its
	// lease has not ended): a reservation of a dead owner is reaped when
	// it stands in the way.
	Alive bool
}

// Socket is a socket bound to a port.
type Socket struct {
	Protocol store.Protocol
	Local    netip.AddrPort
	// Remote is the peer of a connected socket; invalid (the zero
	// AddrPort) for a listening or unconnected one.
	Remote netip.AddrPort
	// State is the TCP state ("LISTEN", "ESTABLISHED", ...); for UDP,
	// "UNCONN" or "ESTABLISHED" (connected).
	State string
	// UID and User are who created the socket, as the kernel records it:
	// known even when its processes cannot be seen.
	UID  int
	User string
	// Processes hold the socket open (a forked server shares it with its
	// children). Empty when none can be seen: another user's, and the
	// caller is not root.
	Processes []Process
}

// Process is a process that holds a socket open.
type Process struct {
	PID  int
	UID  int // the real user id; -1 when unknown
	User string
	Name string
	// Args is its command line; nil when it cannot be read.
	Args []string
}

// Lookup reports who holds each of ports: berth's reservations of it in s
// (none when s is nil) and the sockets the system shows bound to it, with
// the processes that hold them. Every port must be from 1 to 65535; a
// port given twice is reported once. An error is returned only for bad
// input, a store that cannot be read, or ctx's end; what the system cannot
// tell is in each Report's SocketsErr.
func Lookup(ctx context.Context, s store.Store, ports ...uint16) ([]Report, error) {
	if i := slices.Index(ports, 0); i >= 0 {
		return nil, fmt.Errorf("who: %w", &store.FieldError{Field: fmt.Sprintf("ports[%d]", i), Value: "0", Want: "a port from 1 to 65535"})
	}
	ports = slices.Clone(ports)
	slices.Sort(ports)
	ports = slices.Compact(ports)
	out := make([]Report, len(ports))
	idx := map[uint16]int{}
	for i, p := range ports {
		out[i].Port = p
		idx[p] = i
	}
	if s != nil {
		for i, p := range ports {
			rows, err := s.List(ctx, store.Filter{Port: p})
			if err != nil {
				return nil, fmt.Errorf("who: reservations of port %d: %w", p, err)
			}
			for _, r := range rows {
				out[i].Reservations = append(out[i].Reservations, Reservation{r, r.Owner.Alive(ctx)})
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	socks, err := bound(func(p uint16) bool { _, ok := idx[p]; return ok })
	for i := range out {
		out[i].SocketsErr = err
	}
	for _, sk := range socks {
		i := idx[sk.Local.Port()]
		out[i].Sockets = append(out[i].Sockets, sk)
	}
	if locks, err := portlock.List(); err == nil {
		var users userNames
		procs := map[int]*Process{}
		for _, l := range locks {
			i, ok := idx[l.Port]
			if !ok {
				continue
			}
			lk := Lock{Protocol: store.Protocol(l.Network), Addr: l.Addr}
			for _, pid := range l.PIDs {
				if p := process(pid, procs, &users); p != nil {
					lk.Processes = append(lk.Processes, *p)
				}
			}
			out[i].Locks = append(out[i].Locks, lk)
		}
	}
	return out, nil
}

// process describes pid, read once for procs; nil when it has exited.
func process(pid int, procs map[int]*Process, users *userNames) *Process {
	p, ok := procs[pid]
	if !ok {
		sp, err := sockets.Inspect(pid)
		if err == nil {
			p = &Process{PID: pid, UID: sp.UID, User: users.name(sp.UID), Name: sp.Name, Args: sp.Args}
		}
		procs[pid] = p
	}
	return p
}

// bound returns the sockets on the ports want accepts, with their
// processes, leaving out those no descriptor holds any more.
func bound(want func(uint16) bool) ([]Socket, error) {
	raw, err := sockets.List(want)
	if err != nil {
		return nil, err
	}
	inodes := map[uint64]bool{}
	for _, s := range raw {
		if s.Inode != 0 {
			inodes[s.Inode] = true
		}
	}
	holders, err := sockets.Holders(inodes)
	if err != nil {
		return nil, err
	}
	var users userNames
	procs := map[int]*Process{} // read once each, however many sockets it holds
	var out []Socket
	for _, s := range raw {
		if s.Inode == 0 {
			continue
		}
		sk := Socket{Protocol: store.Protocol(s.Protocol), Local: s.Local, State: s.State, UID: s.UID, User: users.name(s.UID)}
		if s.Remote.Port() != 0 {
			sk.Remote = s.Remote
		}
		for _, pid := range holders[s.Inode] {
			if p := process(pid, procs, &users); p != nil {
				sk.Processes = append(sk.Processes, *p)
			}
		}
		out = append(out, sk)
	}
	return out, nil
}

// Bound returns the sockets bound right now to a local port, of every
// port, with the processes that hold them (see Report.Sockets). On systems
// other than Linux it returns an error wrapping errors.ErrUnsupported.
func Bound(ctx context.Context) ([]Socket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := bound(nil)
	if err != nil {
		return nil, fmt.Errorf("who: %w", err)
	}
	return s, nil
}

// Overlaps reports whether a socket bound to local stands in the way of
// binding addr on the same port: the addresses are equal, or either is a
// wildcard of the other's family; the IPv6 wildcard, which a dual-stack
// socket binds, overlaps every address. Ports are not compared.
func Overlaps(local, addr netip.Addr) bool {
	local, addr = local.Unmap(), addr.Unmap()
	switch {
	case local == addr:
		return true
	case local.IsUnspecified() && (local.Is6() || addr.Is4()):
		return true
	case addr.IsUnspecified() && (addr.Is6() || local.Is4()):
		return true
	}
	return false
}

// userNames caches user names by id.
type userNames map[int]string

func (u *userNames) name(uid int) string {
	if uid < 0 {
		return ""
	}
	if *u == nil {
		*u = userNames{}
	}
	if n, ok := (*u)[uid]; ok {
		return n
	}
	n := strconv.Itoa(uid)
	if usr, err := user.LookupId(n); err == nil {
		n = usr.Username
	}
	(*u)[uid] = n
	return n
}

// ErrNotPermitted is the cause of a Signal refused because the process
// belongs to another user and the caller is not root.
var ErrNotPermitted = errors.New("the process belongs to another user")

// Signal sends sig to p, when the caller may: p is of the caller's own
// user, or the caller is root. It never signals process 1 or the caller
// itself, and it checks that pid still runs the program p names (its Name
// and Args, where set: not a process that took its pid since), so a stale
// Report kills nothing else.
func Signal(p Process, sig syscall.Signal) error {
	switch {
	case p.PID <= 1:
		return fmt.Errorf("who: signal: %w", &store.FieldError{Field: "Process.PID", Value: strconv.Itoa(p.PID), Want: "a process id above 1"})
	case p.PID == os.Getpid():
		return fmt.Errorf("who: signal pid %d: that is this very process", p.PID)
	}
	now, err := sockets.Inspect(p.PID)
	if err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			return fmt.Errorf("who: signal pid %d: %w", p.PID, err)
		}
		return fmt.Errorf("who: signal pid %d: %w", p.PID, os.ErrProcessDone)
	}
	if (p.Name != "" && now.Name != p.Name) || (p.Args != nil && !slices.Equal(now.Args, p.Args)) {
		return fmt.Errorf("who: signal pid %d: it now runs %s, not %s: %w", p.PID, now.Name, p.Name, os.ErrProcessDone)
	}
	if euid := os.Geteuid(); euid != 0 && now.UID != euid && now.UID != os.Getuid() {
		return fmt.Errorf("who: signal pid %d (%s): %w (uid %d) and this one is not root", p.PID, p.Name, ErrNotPermitted, now.UID)
	}
	proc, err := os.FindProcess(p.PID)
	if err != nil {
		return fmt.Errorf("who: signal pid %d: %w", p.PID, err)
	}
	if err := proc.Signal(sig); err != nil {
		return fmt.Errorf("who: signal pid %d (%s): %w", p.PID, p.Name, err)
	}
	return nil
}
