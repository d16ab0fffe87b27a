//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// child is one run of COMMAND under berth run --restart or --watch.
type child struct {
	pid  int
	done chan *os.ProcessState // the state it exited with, once
}

// startChild starts COMMAND (path, args) in a process group of its own,
// with the sockets of --listen as descriptors 3, 4, ... Where there are
// sockets it starts berth itself in the role placeArg, which sets
// LISTEN_PID to its own pid, the one COMMAND keeps, and execs COMMAND (see
// place). On Linux the child gets SIGKILL when berth run dies (see
// childAttr), so no COMMAND outlives a berth run killed with SIGKILL and
// keeps its ports bound.
func (a *app) startChild(path string, args, env []string, files []*os.File) (*child, error) {
	cmd := &exec.Cmd{Path: path, Args: args, Env: env, Stdout: a.stdout, Stderr: a.stderr, ExtraFiles: files}
	if !isTerminal(os.Stdin) {
		// A program in a process group other than the terminal's would be
		// stopped when it reads the terminal; it reads end of file instead.
		cmd.Stdin = os.Stdin
	}
	if len(files) > 0 {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("--listen: find berth's own executable: %w", err)
		}
		saved := "-"
		if v, ok := lookupVar(env, "GODEBUG"); ok {
			saved = "=" + v
		}
		cmd.Path = self
		cmd.Args = []string{os.Args[0], placeArg, saved, strconv.Itoa(len(files))}
		for i := range files {
			cmd.Args = append(cmd.Args, strconv.Itoa(3+i))
		}
		cmd.Args = append(append(cmd.Args, path), args...)
		cmd.Env = append(withoutVar(env, "GODEBUG"), "GODEBUG=containermaxprocs=0,updatemaxprocs=0")
	}
	cmd.SysProcAttr = childAttr()
	c := &child{done: make(chan *os.ProcessState, 1)}
	started := make(chan error, 1)
	go func() {
		// Linux sends the parent-death signal when the thread that started
		// the child ends, not the process: this goroutine keeps its thread
		// until the child has exited, and never gives it back.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		c.pid = cmd.Process.Pid
		started <- nil
		_ = cmd.Wait() // a failed copy of output says nothing of the exit
		c.done <- cmd.ProcessState
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	return c, nil
}

// signalGroup sends sig to the process group of c, COMMAND and whatever it
// started: a shell's children too, which hold the sockets as well.
func (c *child) signalGroup(sig syscall.Signal) { _ = unix.Kill(-c.pid, sig) }

// forwarded are the signals berth run passes on to COMMAND; SIGINT and
// SIGTERM also end berth run once COMMAND has exited.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

func isStop(s os.Signal) bool { return s == syscall.SIGINT || s == syscall.SIGTERM }

// supervise runs COMMAND as a child of berth run, which keeps the
// reservations and the sockets of --listen for its own lifetime, and
// starts COMMAND again after it exits (by --restart) or when a path of
// --watch changes. A client that connects between two runs waits in the
// listening socket's backlog until the next run accepts it. It returns
// COMMAND's last exit status as an *exitCode.
func (a *app) supervise(ctx context.Context, path string, args, env []string, files []*os.File, f *runFlags) error {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	changed := make(chan struct{}, 1)
	if len(f.watch) > 0 {
		wg.Go(func() { watch(ctx, f.watch, changed) })
	}
	name := filepath.Base(args[0])
	backoff := firstBackoff
	for run := 1; ; run++ {
		c, err := a.startChild(path, args, env, files)
		if err != nil {
			return err
		}
		a.cfg.Logger.Info("berth run: started", "command", args[0], "pid", c.pid, "run", run)
		startedAt := time.Now()
		var (
			stopSig    os.Signal // SIGINT or SIGTERM received: end when COMMAND has
			restarting bool      // a watched path changed: COMMAND was told to stop
			grace      <-chan time.Time
			st         *os.ProcessState
		)
		for st == nil {
			select {
			case s := <-sigs:
				c.signalGroup(s.(syscall.Signal))
				if isStop(s) {
					stopSig = s
				}
			case <-changed:
				if stopSig == nil && !restarting {
					fmt.Fprintf(a.stderr, "berth run: a watched path changed; stopping %s (pid %d) to start it again\n", name, c.pid)
					restarting = true
					c.signalGroup(syscall.SIGTERM)
					grace = time.After(stopGrace)
				}
			case <-grace:
				fmt.Fprintf(a.stderr, "berth run: %s (pid %d) still runs %v after SIGTERM; sending SIGKILL\n", name, c.pid, stopGrace)
				c.signalGroup(syscall.SIGKILL)
			case st = <-c.done:
			}
		}
		// What COMMAND started and left behind would keep the sockets.
		c.signalGroup(syscall.SIGTERM)
		code := statusCode(st)
		if stopSig != nil {
			return &exitCode{code}
		}
		if restarting {
			backoff = firstBackoff
			continue
		}
		if time.Since(startedAt) >= steadyRun {
			backoff = firstBackoff
		}
		again := f.restart == restartAlways || (f.restart == restartOnFailure && !st.Success())
		var wait <-chan time.Time // nil: until a watched path changes
		if again {
			fmt.Fprintf(a.stderr, "berth run: %s (pid %d) %s; starting it again in %v\n", name, c.pid, exitWords(st), backoff)
			wait = time.After(backoff)
			backoff = min(2*backoff, maxBackoff)
		} else {
			if len(f.watch) == 0 {
				return &exitCode{code}
			}
			fmt.Fprintf(a.stderr, "berth run: %s (pid %d) %s; starting it again when a watched path changes\n", name, c.pid, exitWords(st))
		}
		if s := a.pause(wait, changed, sigs); s != nil {
			// Told to end between two runs: ended by that signal.
			return &exitCode{128 + int(s.(syscall.Signal))}
		}
	}
}

// pause waits for wait (nil: never) or a change of a watched path. It
// returns the stop signal that came first instead, if one did; other
// signals have no COMMAND to go to and are dropped.
func (a *app) pause(wait <-chan time.Time, changed <-chan struct{}, sigs <-chan os.Signal) os.Signal {
	for {
		select {
		case <-wait:
			return nil
		case <-changed:
			return nil
		case s := <-sigs:
			if isStop(s) {
				return s
			}
		}
	}
}

// statusCode is the exit status berth run takes over from COMMAND: its
// exit code, or 128+N when signal N ended it, as shells report it.
func statusCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// exitWords says how COMMAND ended: "exited with status 1", "was killed
// by signal SIGSEGV".
func exitWords(st *os.ProcessState) string {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "was ended by " + signalName(ws.Signal())
	}
	return fmt.Sprintf("exited with status %d", st.ExitCode())
}

// isTerminal reports whether f is a terminal (or another character
// device, such as /dev/null, which COMMAND may as well not read).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// lookupVar returns the value of variable name in env.
func lookupVar(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := cutVar(env[i], name); ok {
			return v, true
		}
	}
	return "", false
}

func cutVar(kv, name string) (string, bool) {
	if len(kv) > len(name) && kv[:len(name)] == name && kv[len(name)] == '=' {
		return kv[len(name)+1:], true
	}
	return "", false
}
