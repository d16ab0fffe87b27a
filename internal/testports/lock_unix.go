//go:build unix

package testports

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// lockFile takes an exclusive flock on f, calling waiting first if another
// process holds it.
func lockFile(f *os.File, waiting func()) error {
	fd := int(f.Fd())
	if err := flock(fd, unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		return err
	}
	waiting()
	return flock(fd, unix.LOCK_EX)
}

func flock(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
