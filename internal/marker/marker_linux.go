package marker

import (
	"bufio"
	"bytes"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Supported reports whether marks exist on this system.
func Supported() bool { return true }

func limit() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return int(min(rl.Cur/4, 4096))
}

type sock int

func (s sock) Close() error { return unix.Close(int(s)) }

// bind binds a datagram socket to the abstract name.
func bind(name string) (closer, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// A leading "@" makes the name abstract (x/sys/unix writes a NUL).
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + name}); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return sock(fd), nil
}

// boundNames reads the abstract names bound in this network namespace
// from /proc/net/unix, whose last column shows an abstract name with "@"
// for its leading NUL.
func boundNames() ([]string, error) {
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil, fmt.Errorf("marker: %w", err)
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 8 {
			continue
		}
		if p := f[len(f)-1]; bytes.HasPrefix(p, []byte("@"+prefix)) {
			names = append(names, string(p[1:]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("marker: read /proc/net/unix: %w", err)
	}
	return names, nil
}

// inherit moves c to a descriptor of 64 or more without close-on-exec.
func inherit(c closer) (closer, error) {
	s, ok := c.(sock)
	if !ok {
		return c, nil
	}
	fd, err := unix.FcntlInt(uintptr(s), unix.F_DUPFD, 64)
	if err != nil {
		return c, err
	}
	_ = s.Close()
	return sock(fd), nil
}
