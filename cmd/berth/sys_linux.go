package main

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// waitParent returns once ppid, the parent, has exited: through a pidfd,
// readable then; without (before Linux 5.3), once the parent changes.
func waitParent(ppid int) {
	if os.Getppid() != ppid {
		return // gone already
	}
	fd, err := unix.PidfdOpen(ppid, 0)
	if err != nil {
		pollParent(ppid)
		return
	}
	defer func() { _ = unix.Close(fd) }()
	// Still the parent: the pid cannot have been reused, so the pidfd is
	// of that process.
	for os.Getppid() == ppid {
		if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// childAttr puts COMMAND in a process group of its own, so each signal
// reaches it once, and has the kernel kill it when berth run dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// zombie reports whether pid has exited and waits for its parent.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}
