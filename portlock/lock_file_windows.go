package portlock

import (
	"cmp"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"
)

// lockDir is under %ProgramData%, which every user of the host can add to.
var lockDir = filepath.Join(cmp.Or(os.Getenv("ProgramData"), os.TempDir()), "berth", "locks")

var (
	kernel32   = syscall.NewLazyDLL("kernel32.dll")
	lockFileEx = kernel32.NewProc("LockFileEx")
)

const (
	lockfileFailImmediately = 0x1
	lockfileExclusiveLock   = 0x2
	errorLockViolation      = syscall.Errno(33)
)

func tryLock(f *os.File, exclusive bool) (bool, error) {
	flags := uintptr(lockfileFailImmediately)
	if exclusive {
		flags |= lockfileExclusiveLock
	}
	var ol syscall.Overlapped
	r, _, err := lockFileEx.Call(f.Fd(), flags, 0, 1, 0, uintptr(unsafe.Pointer(&ol)))
	switch {
	case r != 0:
		return true, nil
	case err == errorLockViolation:
		return false, nil
	default:
		return false, os.NewSyscallError("LockFileEx", err)
	}
}

func dup(f *os.File) (*os.File, error) {
	p, err := syscall.GetCurrentProcess()
	if err != nil {
		return nil, err
	}
	var h syscall.Handle
	if err := syscall.DuplicateHandle(p, syscall.Handle(f.Fd()), p, &h, 0, false, syscall.DUPLICATE_SAME_ACCESS); err != nil {
		return nil, os.NewSyscallError("DuplicateHandle", err)
	}
	return os.NewFile(uintptr(h), f.Name()), nil
}
