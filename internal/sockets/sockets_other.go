//go:build !linux

package sockets

import (
	"errors"
	"fmt"
	"runtime"
)

var errUnsupported = fmt.Errorf("%s does not show berth which sockets are bound or which processes hold them: %w", runtime.GOOS, errors.ErrUnsupported)

// List is not available on this system.
func List(func(uint16) bool) ([]Socket, error) { return nil, errUnsupported }

// Holders is not available on this system.
func Holders(map[uint64]bool) (map[uint64][]int, error) { return nil, errUnsupported }

// Inspect is not available on this system.
func Inspect(pid int) (Process, error) { return Process{PID: pid}, errUnsupported }
