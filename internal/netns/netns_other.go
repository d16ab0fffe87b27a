//go:build !linux

package netns

import (
	"context"
	"fmt"
	"runtime"
)

// Every call fails here: network namespaces are Linux's.
var errNone = fmt.Errorf("%w: %s has none", ErrUnsupported, runtime.GOOS)

func ipPath() string { return "ip" }

// Add fails: network namespaces are Linux's.
func Add(context.Context, string) (NS, error) { return NS{}, errNone }

// Do fails: network namespaces are Linux's.
func (ns NS) Do(func() error) error { return errNone }

// Pids fails: network namespaces are Linux's.
func (ns NS) Pids(context.Context) ([]int, error) { return nil, errNone }

// KillAll fails: network namespaces are Linux's.
func (ns NS) KillAll(context.Context, func(int) bool) (int, error) { return 0, errNone }
