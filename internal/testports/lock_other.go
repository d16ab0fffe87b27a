//go:build !unix

package testports

import "os"

// lockFile does not lock: two runs at once on such a host share the ranges.
func lockFile(*os.File, func()) error { return nil }
