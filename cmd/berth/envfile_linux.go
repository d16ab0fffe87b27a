package main

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// waitParent returns once the process ppid, this process's parent, has
// exited: at once through a pidfd, which becomes readable when it exits;
// where the kernel has none (before Linux 5.3), by watching the parent
// change (an orphan is reparented).
func waitParent(ppid int) {
	if os.Getppid() != ppid {
		return // gone already
	}
	fd, err := unix.PidfdOpen(ppid, 0)
	if err == nil {
		defer func() { _ = unix.Close(fd) }()
		// Still the parent: the pid cannot have been reused, so the pidfd
		// is of that process.
		if os.Getppid() != ppid {
			return
		}
		for {
			_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}
	pollParent(ppid)
}

// pollParent returns once ppid is no longer this process's parent.
func pollParent(ppid int) {
	for os.Getppid() == ppid {
		time.Sleep(200 * time.Millisecond)
	}
}
