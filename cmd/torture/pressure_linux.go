package main

import (
	"fmt"
	"os"
	"syscall"
)

// canPressure reports whether this platform can run -fd-pressure.
const canPressure = true

// countOpen counts the process's open descriptors, less the one it opens
// to count them.
func countOpen() (int, error) {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	return len(names) - 1, nil
}

// lowerNoFile sets the soft RLIMIT_NOFILE to limit, keeping the hard
// limit, and returns the function that sets the old one back.
func lowerNoFile(limit uint64) (restore func() error, err error) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		return nil, fmt.Errorf("getrlimit: %w", err)
	}
	low := syscall.Rlimit{Cur: min(limit, old.Cur), Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		return nil, fmt.Errorf("setrlimit %d: %w", limit, err)
	}
	return func() error { return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) }, nil
}
