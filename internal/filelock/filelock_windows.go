//go:build windows

package filelock

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/windows"
)

const allBytes = ^uint32(0)

// noFollow: Windows has no O_NOFOLLOW; the state directory's ACLs keep
// other users from planting links in it.
const noFollow = 0

func tryLock(f *os.File) (bool, error) {
	err := lockFileEx(f, windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return false, nil
	}
	return err == nil, err
}

func lock(f *os.File) error { return lockFileEx(f, windows.LOCKFILE_EXCLUSIVE_LOCK) }

func unlock(f *os.File) error {
	ol := new(windows.Overlapped)
	if err := windows.UnlockFileEx(windows.Handle(f.Fd()), 0, allBytes, allBytes, ol); err != nil {
		return fmt.Errorf("filelock: unlock %s: %w", f.Name(), err)
	}
	return nil
}

func lockFileEx(f *os.File, flags uint32) error {
	ol := new(windows.Overlapped)
	err := windows.LockFileEx(windows.Handle(f.Fd()), flags, 0, allBytes, allBytes, ol)
	if err != nil && !errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return fmt.Errorf("filelock: lock %s: %w", f.Name(), err)
	}
	return err
}
