//go:build unix

package mru

import "syscall"

// The MRU file is opened never through a symbolic link, and never waiting
// for a writer when something put a FIFO in its place.
const (
	noFollow = syscall.O_NOFOLLOW
	nonBlock = syscall.O_NONBLOCK
)
