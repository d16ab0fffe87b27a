package main

import "syscall"

// childAttr puts COMMAND in a process group of its own, so that each
// signal reaches it once, from berth run, and has the kernel kill it when
// berth run dies, however it dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
