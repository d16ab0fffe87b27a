//go:build unix

package pgcluster

import "syscall"

func stop(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }

func cont(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }
