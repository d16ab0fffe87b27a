//go:build !unix

package main

import (
	"fmt"
	"os"
	"syscall"
)

// signalByName: on this system a process can only be ended (TERM, KILL).
func signalByName(name string) (syscall.Signal, bool) {
	switch name {
	case "SIGTERM":
		return syscall.SIGTERM, true
	case "SIGKILL":
		return syscall.SIGKILL, true
	}
	return 0, false
}

func signalNames() []string { return []string{"KILL", "TERM"} }

func signalName(sig syscall.Signal) string { return fmt.Sprintf("SIG%v", sig) }

func running(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	_ = p.Release()
	return true
}
