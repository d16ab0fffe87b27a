//go:build unix

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/renameio/v2"
)

// writeEnvFile writes env, the NAME=VALUE variables berth run gives
// COMMAND, to path as a dotenv file (for docker compose's .env, an
// editor's envFile, a second shell), atomically, and arranges for it to
// be removed when this process, which COMMAND is about to become, exits.
// The file is removed only while it still holds what was written: a file
// another program (another berth run) has rewritten since stays.
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

// startEnvFileWatch starts berth again as a small process of its own
// session, a child of this one, that waits for this process to exit and
// then removes path if it still holds content. This process execs COMMAND
// next and keeps its pid, so the watcher's parent is COMMAND, and the
// watcher learns that COMMAND has ended when it stops being its parent.
// It has no terminal and no standard streams: a pipeline reading
// COMMAND's output ends when COMMAND does, and ^C reaches COMMAND only.
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

// watchEnvFile is the watcher startEnvFileWatch starts: args are the pid
// of its parent, the file and what it was written with.
func watchEnvFile(args []string) int {
	if len(args) != 3 {
		return exitUsage
	}
	ppid, err := strconv.Atoi(args[0])
	if err != nil {
		return exitUsage
	}
	waitParent(ppid)
	b, err := os.ReadFile(args[1])
	if err == nil && bytes.Equal(b, []byte(args[2])) {
		if err := os.Remove(args[1]); err != nil && !errors.Is(err, os.ErrNotExist) {
			return exitFailure
		}
	}
	return exitOK
}
