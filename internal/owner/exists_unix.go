//go:build linux || darwin

package owner

import (
	"errors"

	"golang.org/x/sys/unix"
)

// exists reports whether a process has pid in this pid namespace, by asking
// the kernel to check a signal without sending it. Only ESRCH means no:
// EPERM is a process of another user.
func exists(pid int) bool { return !errors.Is(unix.Kill(pid, 0), unix.ESRCH) }
