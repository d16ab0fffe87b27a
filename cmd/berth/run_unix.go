//go:build unix

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"
)

// Placing the sockets, berth execs COMMAND from its main thread: the
// parent-death signal berth run --restart gives its child (childAttr) is
// that thread's setting alone, and COMMAND exec'd from another would run
// on after a berth run killed with SIGKILL, its port bound.
func init() {
	if len(os.Args) > 1 && os.Args[1] == placeArg {
		runtime.LockOSThread() // in init: main runs on the main thread
	}
}

// execCommand replaces berth with the program at path. The sockets of
// --listen (files) must reach it as descriptors 3, 4, ..., which a Go
// program cannot move onto safely: its runtime may hold one of them (its
// poller). So berth execs itself again with the sockets wherever they
// are, and that fresh process moves them into place before its runtime
// has opened anything, then execs the program. Both execs keep the pid,
// so LISTEN_PID and the ports' owner stay right.
func execCommand(path string, args, env []string, files []*os.File) error {
	if len(files) == 0 {
		return fmt.Errorf("exec %s: %w", path, syscall.Exec(path, args, env))
	}
	var fds []int
	for _, f := range files {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil { // inherited by the exec
			return fmt.Errorf("--listen: %w", err)
		}
		fds = append(fds, int(f.Fd()))
	}
	self, argv, env, err := placeCmd(path, args, env, fds)
	if err != nil {
		return err
	}
	return fmt.Errorf("exec %s: %w", self, syscall.Exec(self, argv, env))
}

// placeCmd returns the program, arguments and environment that run berth
// as placeArg, to move the sockets at fds to 3, 4, ... and exec path.
func placeCmd(path string, args, env []string, fds []int) (string, []string, []string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, nil, fmt.Errorf("--listen: find berth's own executable: %w", err)
	}
	// The runtime keeps the cgroup files it sizes GOMAXPROCS by open (as
	// descriptors 3 and 4, typically) unless told not to; the program gets
	// GODEBUG as it was.
	saved := "-"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			saved = "=" + v
		}
	}
	argv := []string{os.Args[0], placeArg, saved, strconv.Itoa(len(fds))}
	for _, fd := range fds {
		argv = append(argv, strconv.Itoa(fd))
	}
	argv = append(append(argv, path), args...)
	return self, argv, append(withoutVars(env, "GODEBUG"), "GODEBUG=containermaxprocs=0,updatemaxprocs=0"), nil
}

// placeAndExec is berth re-executed by execCommand (see placeCmd for
// args). It never returns on success.
func placeAndExec(args []string, stderr io.Writer) int {
	fmt.Fprintf(stderr, "berth run: %v\n", place(args))
	return exitFailure
}

func place(args []string) error {
	if len(args) < 2 {
		return errors.New("socket placement: no count")
	}
	env := withoutVars(os.Environ(), "GODEBUG")
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
	env = append(withoutVars(env, "LISTEN_PID"), "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	path, argv := args[1+n], args[2+n:]
	return fmt.Errorf("exec %s: %w", path, syscall.Exec(path, argv, env))
}

// keepAcrossExec moves files to descriptors from 64 up that pass through
// exec, out of the way of those a program is handed from 3 up, and closes
// the originals. The new ones belong to the program berth run becomes.
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

// writeEnvFile writes env, COMMAND's NAME=VALUE variables, to path as a
// dotenv file, atomically, and arranges for its removal when this process,
// which COMMAND is about to become, exits: only while it still holds what
// was written, since another berth run may have rewritten it.
func writeEnvFile(path string, env []string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return usagef("--env-file %q: %v", path, err)
	}
	content := []byte(strings.Join(env, "\n") + "\n")
	if err := renameio.WriteFile(abs, content, 0o644); err != nil {
		return fmt.Errorf("--env-file: %w", err)
	}
	if err := startEnvFileWatch(abs, content); err != nil {
		_ = os.Remove(abs)
		return fmt.Errorf("--env-file %s: cannot arrange its removal when COMMAND exits: %w", path, err)
	}
	return nil
}

// startEnvFileWatch starts berth again as a child in a session of its own
// that waits for this process (COMMAND, once exec'd) to exit, then removes
// path if it still holds content. It has no terminal and no standard
// streams: a pipeline reading COMMAND's output ends when COMMAND does, and
// ^C reaches COMMAND only.
func startEnvFileWatch(path string, content []byte) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, envWatchArg, strconv.Itoa(os.Getpid()), path, string(content))
	cmd.Args[0] = os.Args[0] // as berth was run (a multi-call binary dispatches on it)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Not waited for: it outlives this process, whose program COMMAND
	// replaces; init (or a subreaper) reaps it.
	return cmd.Process.Release()
}

// watchEnvFile is the watcher startEnvFileWatch starts: args are its
// parent's pid, the file and its content.
func watchEnvFile(args []string) int {
	if len(args) != 3 {
		return exitUsage
	}
	ppid, err := strconv.Atoi(args[0])
	if err != nil {
		return exitUsage
	}
	waitParent(ppid)
	if b, err := os.ReadFile(args[1]); err == nil && bytes.Equal(b, []byte(args[2])) {
		if err := os.Remove(args[1]); err != nil && !errors.Is(err, os.ErrNotExist) {
			return exitFailure
		}
	}
	return exitOK
}

func pollParent(ppid int) {
	for os.Getppid() == ppid {
		time.Sleep(200 * time.Millisecond)
	}
}

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

// running reports whether process pid exists and is not a zombie.
func running(pid int) bool {
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	return !zombie(pid)
}
