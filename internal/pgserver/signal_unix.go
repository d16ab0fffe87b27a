//go:build unix

package pgserver

import (
	"errors"
	"syscall"
)

func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// exists reports whether pid names a process this program may signal.
func exists(pid int) bool { return syscall.Kill(pid, 0) == nil }

// sigkill sends pid SIGKILL; a process already gone is not an error.
func sigkill(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// StopProcess stops pid with SIGSTOP.
func StopProcess(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }

// ContinueProcess resumes pid with SIGCONT.
func ContinueProcess(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }
