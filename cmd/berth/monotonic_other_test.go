//go:build !linux

package main

// monotonic: only the Linux tests compare times across processes.
func monotonic() int64 { return 0 }
