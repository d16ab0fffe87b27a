//go:build unix && !linux

package main

import "syscall"

// childAttr puts COMMAND in a process group of its own, so that each
// signal reaches it once, from berth run. These systems have no
// parent-death signal: COMMAND outlives a berth run killed with SIGKILL.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
