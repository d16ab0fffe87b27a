//go:build !unix

package main

import "os"

func freeze(*os.Process) error { return errNoFreeze }

func thaw(*os.Process) error { return errNoFreeze }

// canFreeze reports whether this platform can stop a process.
const canFreeze = false
