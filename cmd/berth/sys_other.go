//go:build !unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// execCommand: berth run needs exec, which keeps the process (and so the ports' owner)
// while it replaces the program; Windows has none.
func execCommand(string, []string, []string, []*os.File) error {
	return errors.New("berth run is not available on this system: it needs exec, which keeps the process id; use 'berth get' and 'berth transfer' instead")
}

// supervise: berth run --restart and --watch need process groups and descriptor
// inheritance by number, which this system does not have.
func (a *app) supervise(context.Context, string, []string, []string, []*os.File, *runFlags) error {
	return errors.New("berth run --restart and --watch are not available on this system")
}

func writeEnvFile(string, []string) error {
	return errors.New("--env-file: berth run is not available on this system")
}

func placeAndExec([]string, io.Writer) int { return exitFailure }

func watchEnvFile([]string) int { return exitFailure }

// keepAcrossExec closes files: there is no exec to keep them across.
func keepAcrossExec(files []*os.File) error {
	for _, f := range files {
		_ = f.Close()
	}
	return nil
}

// signalByName: on this system a process can only be ended (TERM, KILL).
func signalByName(name string) (syscall.Signal, bool) {
	sig, ok := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL}[name]
	return sig, ok
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
