//go:build !unix

package main

import (
	"errors"
	"io"
	"os"
)

// placeArg is never given on systems without exec.
const placeArg = "__berth-place-sockets"

// execCommand: berth run needs exec, which keeps the process (and so the
// ports' owner) while it replaces the program; Windows has none.
func execCommand(string, []string, []string, []*os.File) error {
	return errors.New("berth run is not available on this system: it needs exec, which keeps the process id; use 'berth get' and 'berth transfer' instead")
}

func placeAndExec([]string, io.Writer) int { return exitFailure }

// keepAcrossExec closes files: there is no exec to keep them across.
func keepAcrossExec(files []*os.File) error {
	for _, f := range files {
		_ = f.Close()
	}
	return nil
}
