//go:build unix

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// placeArg starts the argument list of berth re-executed to put the
// sockets of berth run --listen at descriptors 3 and up (see execCommand).
const placeArg = "__berth-place-sockets"

// Placing the sockets, berth execs COMMAND from its main thread. The
// parent-death signal that berth run --restart gives its child (see
// childAttr) is the setting of that thread alone: an exec from another
// thread of the process would leave COMMAND without it, running on after
// a berth run killed with SIGKILL, its port bound.
func init() {
	if len(os.Args) > 1 && os.Args[1] == placeArg {
		runtime.LockOSThread() // in init: main runs on the main thread
	}
}

// execCommand replaces berth with the program at path. With files (the
// sockets of --listen), they must reach it as descriptors 3, 4, ...: a Go
// program cannot move descriptors onto those numbers safely, since its
// runtime may hold one of them (its poller) and use it at any moment. So
// berth executes itself again, with the sockets inherited wherever they
// are; that fresh process moves them into place before its runtime has
// opened anything, and executes the program. Both execs keep the process
// id, so LISTEN_PID and the ports' owner stay right.
func execCommand(path string, args, env []string, files []*os.File) error {
	if len(files) == 0 {
		return fmt.Errorf("exec %s: %w", path, syscall.Exec(path, args, env))
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--listen: find berth's own executable: %w", err)
	}
	// The runtime keeps the cgroup files it sizes GOMAXPROCS by open (as
	// descriptors 3 and 4, typically) unless told not to; the program gets
	// GODEBUG as it was.
	godebug, had := os.LookupEnv("GODEBUG")
	saved := "-"
	if had {
		saved = "=" + godebug
	}
	env = append(withoutVar(env, "GODEBUG"), "GODEBUG=containermaxprocs=0,updatemaxprocs=0")
	argv := []string{os.Args[0], placeArg, saved, strconv.Itoa(len(files))}
	for _, f := range files {
		fd := int(f.Fd())
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil { // inherited by the exec
			return fmt.Errorf("--listen: %w", err)
		}
		argv = append(argv, strconv.Itoa(fd))
	}
	argv = append(argv, path)
	argv = append(argv, args...)
	return fmt.Errorf("exec %s: %w", self, syscall.Exec(self, argv, env))
}

// placeAndExec is berth re-executed by execCommand: args are N, the N
// descriptors, the program's path and its arguments. It never returns on
// success.
func placeAndExec(args []string, stderr io.Writer) int {
	err := place(args)
	fmt.Fprintf(stderr, "berth run: %v\n", err)
	return exitFailure
}

func place(args []string) error {
	if len(args) < 2 {
		return errors.New("socket placement: no count")
	}
	env := withoutVar(os.Environ(), "GODEBUG")
	if v, ok := strings.CutPrefix(args[0], "="); ok {
		env = append(env, "GODEBUG="+v)
	}
	args = args[1:]
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 || len(args) < 2+n {
		return fmt.Errorf("socket placement: bad arguments %q", args)
	}
	tmp := make([]int, n)
	for i := range n {
		fd, err := strconv.Atoi(args[1+i])
		if err != nil {
			return fmt.Errorf("socket placement: descriptor %q", args[1+i])
		}
		// Above the target numbers first, so that no move overwrites a
		// socket still to be moved; close-on-exec, so only the targets
		// reach the program.
		if tmp[i], err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3+n); err != nil {
			return fmt.Errorf("socket placement: %w", err)
		}
		_ = unix.Close(fd)
	}
	for i := range n {
		if _, err := unix.FcntlInt(uintptr(3+i), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
			l, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", 3+i))
			return fmt.Errorf("socket placement: descriptor %d is in use (%s); cannot pass the sockets at 3 to %d", 3+i, l, 2+n)
		}
	}
	for i, fd := range tmp {
		if err := unix.Dup2(fd, 3+i); err != nil {
			return fmt.Errorf("socket placement: %w", err)
		}
	}
	// The program keeps this process's id: berth run's own when it execs,
	// a new child's when berth run --restart starts one.
	env = append(withoutVar(env, "LISTEN_PID"), "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	path, argv := args[1+n], args[2+n:]
	return fmt.Errorf("exec %s: %w", path, syscall.Exec(path, argv, env))
}

// keepAcrossExec moves files to descriptors from 64 up that pass through
// exec (not close-on-exec), out of the way of those a program is handed
// from 3 up, and closes the originals. The new descriptors are never
// closed here: they belong to the program berth run becomes.
func keepAcrossExec(files []*os.File) error {
	var errs []error
	for _, f := range files {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD, 64); err != nil {
			errs = append(errs, err)
		}
		_ = f.Close()
	}
	return errors.Join(errs...)
}
