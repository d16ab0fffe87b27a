//go:build unix

package main

import (
	"errors"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// signalByName returns the signal named name (SIGTERM).
func signalByName(name string) (syscall.Signal, bool) {
	sig := unix.SignalNum(name)
	return sig, sig != 0
}

// signalNames lists the common signals --kill takes by name.
func signalNames() []string { return []string{"HUP", "INT", "QUIT", "KILL", "USR1", "USR2", "TERM"} }

// signalName names sig as kill(1) does: SIGTERM.
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return "signal " + strings.TrimPrefix(sig.String(), "signal ")
}

// running reports whether process pid exists and is not a zombie (a
// child of another process that has not waited for it).
func running(pid int) bool {
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	return !zombie(pid)
}
