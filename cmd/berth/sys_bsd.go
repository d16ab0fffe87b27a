//go:build unix && !linux

package main

import "syscall"

// waitParent returns once ppid, the parent, has exited: by polling, since a removal a
// fraction of a second late costs nothing.
func waitParent(ppid int) { pollParent(ppid) }

// childAttr puts COMMAND in a process group of its own. There is no parent-death signal:
// COMMAND outlives a berth run killed with SIGKILL.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// zombie: other systems have no /proc to tell; kill(pid, 0) is all there is.
func zombie(int) bool { return false }
