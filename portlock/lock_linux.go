package portlock

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"
)

// sock is a socket bound to a lock's name.
type sock int

func (s sock) Close() error { return syscall.Close(int(s)) }
func (s sock) fd() uintptr  { return uintptr(s) }

// bindName binds a new datagram socket to the abstract name. It returns
// syscall.EADDRINUSE when the name is held.
func bindName(n string) (sock, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
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

func newProber() (prober, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	return prober(fd), nil
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

func (p prober) Close() error { return syscall.Close(int(p)) }

// retries is how many times a lock whose check met a name held for a
// moment (another request taking its own names, which will give them back)
// is tried again.
const retries = 3

func acquire(network string, addr netip.Addr, port uint16) ([]handle, error) {
	p := prober(-1)
	defer func() {
		if p >= 0 {
			_ = p.Close()
		}
	}()
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
		if p < 0 {
			var perr error
			if p, perr = newProber(); perr != nil {
				return nil, perr
			}
		}
		if held, herr := p.held(in); herr != nil || held {
			return hs, err
		}
	}
}

// acquireOnce is one attempt of acquire. in is the name the check found
// held, when that is why it failed.
func acquireOnce(network string, addr netip.Addr, port uint16) (hs []handle, in string, err error) {
	held := func(e *HeldError) error {
		e.Network, e.Addr, e.Port = network, addr, port
		return e
	}
	if addr.IsUnspecified() {
		w, err := bindName(name(network, port, "*"))
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, "", held(&HeldError{In: addr})
		} else if err != nil {
			return nil, "", err
		}
		for i := range slots {
			n := name(network, port, slotTag(i))
			taken, err := prober(w).held(n)
			if err != nil || taken {
				_ = w.Close()
				if err != nil {
					return nil, "", err
				}
				return nil, n, held(&HeldError{})
			}
		}
		return []handle{w}, "", nil
	}
	own, err := bindName(name(network, port, addrTag(addr)))
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, "", held(&HeldError{In: addr})
	} else if err != nil {
		return nil, "", err
	}
	slot := sock(-1)
	for i := range slots {
		s, err := bindName(name(network, port, slotTag(i)))
		if err == nil {
			slot = s
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			_ = own.Close()
			return nil, "", err
		}
	}
	if slot < 0 {
		_ = own.Close()
		return nil, "", held(&HeldError{In: addr, Slots: true})
	}
	wild := name(network, port, "*")
	taken, err := prober(slot).held(wild)
	if err != nil || taken {
		_ = own.Close()
		_ = slot.Close()
		if err != nil {
			return nil, "", err
		}
		in := netip.IPv4Unspecified()
		if addr.Is6() {
			in = netip.IPv6Unspecified()
		}
		return nil, wild, held(&HeldError{In: in})
	}
	return []handle{own, slot}, "", nil
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

// inode returns the inode of the socket behind fd.
func inode(fd uintptr) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(fd), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func heldBy(pid int, h handle) bool {
	ino, err := inode(h.fd())
	if err != nil {
		return false
	}
	want := fmt.Sprintf("socket:[%d]", ino)
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
			return true
		}
	}
	return false
}
