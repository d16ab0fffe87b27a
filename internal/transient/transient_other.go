//go:build !unix

package transient

import "syscall"

// diskQuota stands for an exhausted disk quota, which this OS reports as a
// full disk.
const diskQuota = syscall.ENOSPC

var kinds = []kind{
	{syscall.EMFILE, "too many open files", "this process has used up its file descriptors; close some"},
	{syscall.ENFILE, "too many open files in the system", ""},
	{syscall.ENOMEM, "out of memory", ""},
	{syscall.ENOSPC, "no space left on the device", "free some space"},
	{syscall.EINTR, "interrupted", ""},
	{syscall.EAGAIN, "resource temporarily unavailable", ""},
}

// DiskFull reports nothing on this OS: its errors say when a disk is full.
func DiskFull(string) error { return nil }
