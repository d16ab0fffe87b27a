package owner

import (
	"context"
	"fmt"
)

// Process is what berth reads of a running process to tell how it came to
// run berth: which process started it, with what program and command line,
// and, on Linux, two signs that tell a forked copy of a program from a new
// start of it. Fields that cannot be read are left at their zero value.
type Process struct {
	PID  int
	PPID int      // its parent's pid; 0 when unknown
	Name string   // the kernel's name for it (on Linux the comm, at most 15 bytes)
	Exe  string   // the path of its executable; "" when it cannot be read
	Args []string // its command line; nil when it cannot be read

	// Layout is where the kernel placed its stack and its arguments
	// (fields 28 and 48 of /proc/PID/stat). A forked child keeps its
	// parent's layout until it execs a program; with address space
	// randomisation on, every exec gets a new one. "" when unknown: other
	// systems, a process the caller may not trace, a kernel before 3.5.
	Layout string

	// Stdin is what its standard input is, as Linux names it in
	// /proc/PID/fd/0: a path ("/dev/null") or "pipe:[1234]". "" when
	// unknown.
	Stdin string
}

// Inspect reads process pid of this host. It returns an error wrapping
// ErrNotRunning when no process has the pid or it has exited.
func Inspect(ctx context.Context, pid int) (Process, error) {
	if !validPID(pid) {
		return Process{}, fmt.Errorf("owner: pid %d: %w; want a positive process id", pid, ErrNotRunning)
	}
	if err := ctx.Err(); err != nil {
		return Process{}, err
	}
	return inspect(ctx, pid)
}
