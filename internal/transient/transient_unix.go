//go:build unix

package transient

import (
	"fmt"
	"syscall"
)

// diskQuota is the error number of an exhausted disk quota.
const diskQuota = syscall.EDQUOT

var kinds = []kind{
	{syscall.EMFILE, "too many open files", "this process has used up its file descriptors; raise its limit (ulimit -n) or close some"},
	{syscall.ENFILE, "too many open files in the system", "the host has used up its file descriptors"},
	{syscall.ENOMEM, "out of memory", ""},
	{syscall.ENOBUFS, "out of buffer space", ""},
	{syscall.ENOSPC, "no space left on the device", "free some space"},
	{syscall.EDQUOT, "disk quota exceeded", "free some space or raise the quota"},
	{syscall.EINTR, "interrupted by a signal", ""},
	{syscall.EAGAIN, "resource temporarily unavailable", ""},
}

// minFree is the free space, in bytes, below which DiskFull calls a file
// system full: less than SQLite needs to grow a WAL by a few pages.
const minFree = 64 << 10

// DiskFull reports whether the file system that holds dir has (almost) no
// space left for this process: it returns an error wrapping ENOSPC that
// says so, or nil when there is room or statfs fails. SQLite reports a
// write that failed for want of space as SQLITE_FULL only for ENOSPC, and
// as an I/O error otherwise (EDQUOT, a full tmpfs under its shared memory).
func DiskFull(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return nil
	}
	free := uint64(st.Bavail) * uint64(st.Bsize) //nolint:gosec,unconvert // Bsize is never negative; its type differs by OS
	if free >= minFree {
		return nil
	}
	return fmt.Errorf("%s has %d bytes free: %w", dir, free, syscall.ENOSPC)
}
