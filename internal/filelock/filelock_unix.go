//go:build unix

package filelock

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

const noFollow = unix.O_NOFOLLOW

func tryLock(f *os.File) (bool, error) {
	err := flock(f, unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}

func lock(f *os.File) error   { return flock(f, unix.LOCK_EX) }
func unlock(f *os.File) error { return flock(f, unix.LOCK_UN) }

func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = unix.Flock(int(fd), how)
			if !errors.Is(ferr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	if ferr != nil && !errors.Is(ferr, unix.EWOULDBLOCK) {
		return fmt.Errorf("filelock: flock %s: %w", f.Name(), ferr)
	}
	return ferr
}
