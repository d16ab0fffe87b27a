//go:build unix && !linux

package portlock

import (
	"os"
	"syscall"
)

// lockDir is shared by every user of the host: unlike TMPDIR, which macOS
// gives each user of its own.
const lockDir = "/tmp/berth-locks"

func tryLock(f *os.File, exclusive bool) (bool, error) {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	switch err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err {
	case nil:
		return true, nil
	case syscall.EWOULDBLOCK:
		return false, nil
	default:
		return false, os.NewSyscallError("flock", err)
	}
}

func dup(f *os.File) (*os.File, error) {
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return nil, os.NewSyscallError("dup", err)
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), f.Name()), nil
}
