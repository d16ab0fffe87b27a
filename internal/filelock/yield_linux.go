package filelock

import "golang.org/x/sys/unix"

// Yield gives the rest of this thread's time slice to another runnable
// thread, if there is one (sched_yield).
//
// flock hands a released lock to no one: every waiter is woken, and the
// first to run takes it. The process that has just let go is still on
// its CPU and, looping, takes the lock again before the waiters it woke
// have run; with more processes than cores that starves some of them for
// many rounds. A process that had to wait for the lock yields once it lets
// go, so that a woken waiter runs first: with 16 processes on 2 cores it
// halved the slowest waits (BENCHMARKS.md, "Waiting for the write lock").
func Yield() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
