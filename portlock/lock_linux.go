package portlock

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// prefix starts the name of every lock. The number is the version of the
// naming scheme: berths that name locks differently must not share it.
const prefix = "berth/1/"

// name is the abstract name of a lock: tag is the address's (addrTag), or
// "s<i>" for slot i.
func name(network string, port uint16, tag string) string {
	return prefix + network + "/" + strconv.Itoa(int(port)) + "/" + tag
}

func slotTag(i int) string { return "s" + strconv.Itoa(i) }

// sock is a socket bound to a lock's name.
type sock int

func (s sock) Close() error { return syscall.Close(int(s)) }
func (s sock) fd() uintptr  { return uintptr(s) }

// bindName binds a new datagram socket to the abstract name. It returns
// syscall.EADDRINUSE when the name is held.
func bindName(n string) (sock, error) {
	fd, err := dgram()
	if err != nil {
		return -1, err
	}
	// A leading "@" makes the name abstract: syscall writes a NUL.
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: "@" + n}); err != nil {
		_ = syscall.Close(fd)
		if errors.Is(err, syscall.EADDRINUSE) {
			return -1, err
		}
		return -1, os.NewSyscallError("bind", err)
	}
	return sock(fd), nil
}

// A prober asks whether names are held, without holding them: a connect of
// a datagram socket to each (ECONNREFUSED: nobody holds it). A lock's own
// socket serves as the prober of its check: a connect that is refused
// leaves it as it was, and one that succeeds fails the lock, which closes
// the socket.
type prober int

// dgram is a new unix datagram socket: a lock's, or a prober.
func dgram() (int, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	return fd, os.NewSyscallError("socket", err)
}

func (p prober) held(n string) (bool, error) {
	err := syscall.Connect(int(p), &syscall.SockaddrUnix{Name: "@" + n})
	switch err {
	case nil, syscall.EPERM:
		// EPERM: a socket bound to the name refuses us (it is connected
		// to another); someone holds the name all the same. (A name is
		// held per socket type: one bound by a socket of another type is
		// neither found here nor in the way of a lock's bind.)
		return true, nil
	case syscall.ECONNREFUSED:
		return false, nil
	}
	return false, os.NewSyscallError("connect", err)
}

// retries is how many times a lock whose check met a name held for a
// moment (another request taking its own names, which will give them back)
// is tried again.
const retries = 3

func acquire(network string, addr netip.Addr, port uint16) ([]handle, error) {
	for try := 0; ; try++ {
		hs, in, err := acquireOnce(network, addr, port)
		if err == nil || !errors.Is(err, ErrHeld) || try == retries || in == "" {
			return hs, err
		}
		// The check found a name of the other kind held. It may be a
		// request that is taking its own names and will let go once it
		// sees ours: wait a moment at random, and try again only if that
		// name is free by then.
		time.Sleep(time.Duration(50+rand.IntN(450)) * time.Microsecond)
		p, perr := dgram()
		if perr != nil {
			return nil, perr
		}
		held, herr := prober(p).held(in)
		_ = syscall.Close(p)
		if herr != nil || held {
			return hs, err
		}
	}
}

// acquireOnce is one attempt of acquire. in is the name the check found
// held, when that is why it failed.
func acquireOnce(network string, addr netip.Addr, port uint16) (_ []handle, in string, err error) {
	held := &HeldError{Network: network, Addr: addr, Port: port, In: addr}
	own, err := bindName(name(network, port, addrTag(addr)))
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, "", held
	} else if err != nil {
		return nil, "", err
	}
	got := []handle{own}
	defer func() {
		if err != nil {
			for _, h := range got {
				_ = h.Close()
			}
		}
	}()
	// A wildcard checks every slot; an address takes a slot and checks
	// the wildcard.
	var check []string
	if addr.IsUnspecified() {
		held.In = netip.Addr{}
		for i := range slots {
			check = append(check, name(network, port, slotTag(i)))
		}
	} else {
		held.In = netip.IPv4Unspecified()
		if addr.Is6() {
			held.In = netip.IPv6Unspecified()
		}
		check = []string{name(network, port, "*")}
		for i := 0; len(got) == 1; i++ {
			if i == slots {
				return nil, "", &HeldError{Network: network, Addr: addr, Port: port, In: addr, Slots: true}
			}
			s, err := bindName(name(network, port, slotTag(i)))
			if err == nil {
				got = append(got, s)
			} else if !errors.Is(err, syscall.EADDRINUSE) {
				return nil, "", err
			}
		}
	}
	for _, n := range check {
		taken, err := prober(got[len(got)-1].fd()).held(n)
		if err != nil {
			return nil, "", err
		} else if taken {
			return nil, n, held
		}
	}
	return got, "", nil
}

// dupFile returns a copy of h's descriptor as a file, close-on-exec.
func dupFile(h handle, n string) (*os.File, error) {
	fd, err := fcntl(h.fd(), syscall.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, err
	}
	return os.NewFile(fd, n), nil
}

// inherit moves h to a descriptor of 64 or more without close-on-exec.
func inherit(h handle) (handle, error) {
	fd, err := fcntl(h.fd(), syscall.F_DUPFD, 64)
	if err != nil {
		return h, err
	}
	_ = h.Close()
	return sock(fd), nil
}

func fcntl(fd uintptr, cmd, arg int) (uintptr, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, uintptr(cmd), uintptr(arg))
	if errno != 0 {
		return 0, os.NewSyscallError("fcntl", errno)
	}
	return r, nil
}

func heldBy(pid int, h handle) bool {
	var st syscall.Stat_t
	return syscall.Fstat(int(h.fd()), &st) == nil && slices.Contains(sockets(pid), st.Ino)
}
