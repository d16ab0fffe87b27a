//go:build unix

package statestore

import "golang.org/x/sys/unix"

// writable reports whether this process may write path now, as the kernel
// judges it (an immutable file is not writable even for root).
func writable(path string) bool { return unix.Access(path, unix.W_OK) == nil }
