//go:build unix

package main

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
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

// startChild starts COMMAND in a process group of its own, with the
// sockets of --listen as descriptors 3, 4, ... placed by berth itself as
// placeArg, which sets LISTEN_PID to the pid COMMAND keeps. On Linux the
// child gets SIGKILL when berth run dies (childAttr), so no COMMAND
// outlives a berth run killed with SIGKILL and keeps its ports bound.
func (a *app) startChild(path string, args, env []string, files []*os.File) (*child, error) {
	cmd := &exec.Cmd{Path: path, Args: args, Env: env, Stdout: a.stdout, Stderr: a.stderr, ExtraFiles: files}
	if !isTerminal(os.Stdin) {
		// A program in a process group other than the terminal's would be
		// stopped when it reads the terminal; it reads end of file instead.
		cmd.Stdin = os.Stdin
	}
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i := range files {
			fds[i] = 3 + i
		}
		var err error
		if cmd.Path, cmd.Args, cmd.Env, err = placeCmd(path, args, env, fds); err != nil {
			return nil, err
		}
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

// supervise runs COMMAND as a child of berth run, which keeps the ports
// and the sockets of --listen for its own lifetime, and starts COMMAND
// again after it exits (--restart) or when a path of --watch changes; a
// client that connects in between waits in the backlog. It returns
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
		code, how := exitOf(st)
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
		var wait <-chan time.Time // nil: until a watched path changes
		switch {
		case f.restart == "always" || (f.restart == "on-failure" && !st.Success()):
			fmt.Fprintf(a.stderr, "berth run: %s (pid %d) %s; starting it again in %v\n", name, c.pid, how, backoff)
			wait = time.After(backoff)
			backoff = min(2*backoff, maxBackoff)
		case len(f.watch) == 0:
			return &exitCode{code}
		default:
			fmt.Fprintf(a.stderr, "berth run: %s (pid %d) %s; starting it again when a watched path changes\n", name, c.pid, how)
		}
		if s := a.pause(wait, changed, sigs); s != nil {
			// Told to end between two runs: ended by that signal.
			return &exitCode{128 + int(s.(syscall.Signal))}
		}
	}
}

// pause waits for wait (nil: never) or a change of a watched path, or
// returns the stop signal that came first; other signals are dropped.
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

// exitOf is COMMAND's exit status, 128+N when signal N ended it, and how
// it ended in words: "exited with status 1", "was ended by SIGSEGV".
func exitOf(st *os.ProcessState) (int, string) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), "was ended by " + signalName(ws.Signal())
	}
	return st.ExitCode(), fmt.Sprintf("exited with status %d", st.ExitCode())
}

// Backoff between restarts of a command that keeps exiting: it starts at
// firstBackoff, doubles with each exit that comes sooner than steadyRun
// after the start, up to maxBackoff, and starts over once the command has
// run for steadyRun.
const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 10 * time.Second
	steadyRun    = 10 * time.Second
)

// stopGrace is how long berth run waits for COMMAND to exit after SIGTERM,
// on a change of a watched path, before it sends SIGKILL.
const stopGrace = 5 * time.Second

// How often watched paths are looked at, and how long they must stay
// unchanged before a restart (a save, a build, come as bursts of writes).
const (
	watchPoll     = 200 * time.Millisecond
	watchDebounce = 300 * time.Millisecond
)

// fileState is what berth run compares of a watched file.
type fileState struct {
	size    int64
	modTime time.Time
	mode    fs.FileMode
}

// snapshot returns the state of every file under paths, but .git and
// node_modules and what cannot be read.
func snapshot(paths []string) map[string]fileState {
	out := map[string]fileState{}
	for _, root := range paths {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && p != root && (d.Name() == ".git" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			if info, err := d.Info(); err == nil {
				out[p] = fileState{info.Size(), info.ModTime(), info.Mode()}
			}
			return nil
		})
	}
	return out
}

// watch sends on changed, without blocking, each time the files under
// paths change and then stay unchanged for watchDebounce, until ctx ends.
// Polling works on every file system (network and bind mounts).
func watch(ctx context.Context, paths []string, changed chan<- struct{}) {
	last := snapshot(paths)
	var changedAt time.Time // of a change not yet reported
	t := time.NewTicker(watchPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := snapshot(paths)
		if !maps.EqualFunc(last, now, func(v, w fileState) bool { return w.modTime.Equal(v.modTime) && w.size == v.size && w.mode == v.mode }) {
			last, changedAt = now, time.Now()
			continue
		}
		if !changedAt.IsZero() && time.Since(changedAt) >= watchDebounce {
			changedAt = time.Time{}
			select {
			case changed <- struct{}{}:
			default: // one is pending already
			}
		}
	}
}
