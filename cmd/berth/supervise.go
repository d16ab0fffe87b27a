package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Restart policies of berth run --restart.
const (
	restartNo        = "no"
	restartOnFailure = "on-failure"
	restartAlways    = "always"
)

// exitCode is the error of a command that ends with the exit status of the
// program it ran: run exits with code, printing nothing.
type exitCode struct{ code int }

func (e *exitCode) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// supervising reports whether berth run stays the parent of COMMAND.
func (f *runFlags) supervising() bool { return f.restart != restartNo || len(f.watch) > 0 }

// checkSupervise checks --restart and --watch.
func (f *runFlags) checkSupervise() error {
	switch f.restart {
	case restartNo, restartOnFailure, restartAlways:
	default:
		return usagef("--restart %q: want no, on-failure or always", f.restart)
	}
	for _, p := range f.watch {
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return usagef("--watch %q: no such file or directory; want a file or directory that exists", p)
			}
			return usagef("--watch %q: %v", p, err)
		}
	}
	return nil
}
