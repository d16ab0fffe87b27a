//go:build unix && !linux

package main

import "syscall"

// waitParent returns once the process ppid, this process's parent, has
// exited. These systems have no pidfd; a kqueue NOTE_EXIT would do on the
// BSDs and macOS, but the file's removal a fraction of a second late costs
// nothing.
func waitParent(ppid int) { pollParent(ppid) }

// childAttr puts COMMAND in a process group of its own, so that each
// signal reaches it once, from berth run. These systems have no
// parent-death signal: COMMAND outlives a berth run killed with SIGKILL.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// zombie: other systems have no /proc to tell; kill(pid, 0) is all there is.
func zombie(int) bool { return false }
