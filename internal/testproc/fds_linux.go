package testproc

import (
	"os"
	"strconv"
	"syscall"
)

// LeaveSpareFDs lowers the process's RLIMIT_NOFILE so that exactly n more
// descriptors can be opened, for a worker that tests what berth does when
// they run out. A new descriptor takes the lowest free number, so it first
// fills the holes below the highest one open, with descriptors of
// /dev/null kept for the life of the process.
func LeaveSpareFDs(n int) error {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	top := 0
	for _, e := range fds {
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			top = max(top, fd)
		}
	}
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return err
		}
		if int(f.Fd()) > top {
			_ = f.Close()
			break
		}
		// Kept open: it fills a hole.
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = uint64(top + 1 + n)
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}
