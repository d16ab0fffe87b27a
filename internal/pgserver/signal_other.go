//go:build !unix

package pgserver

import (
	"errors"
	"os"
)

func gone(pid int) bool {
	_, err := os.FindProcess(pid)
	return err != nil
}

func exists(pid int) bool { return !gone(pid) }

// sigkill kills pid; a process already gone is not an error.
func sigkill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	if err := p.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

var errNoSignals = errors.New("processes cannot be stopped and resumed on this system")

// StopProcess stops pid with SIGSTOP.
func StopProcess(int) error { return errNoSignals }

// ContinueProcess resumes pid with SIGCONT.
func ContinueProcess(int) error { return errNoSignals }
