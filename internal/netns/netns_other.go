//go:build !linux

package netns

import (
	"context"
	"fmt"
	"runtime"
)

func ipPath() string { return "ip" }

// Add fails: network namespaces are Linux's.
func Add(ctx context.Context, name string) (NS, error) {
	return NS{}, fmt.Errorf("%w: %s has none", ErrUnsupported, runtime.GOOS)
}

func del(context.Context, string) error { return nil }

func prefixForTest() string { return "berth-test" }

// Do fails: network namespaces are Linux's.
func (ns NS) Do(func() error) error {
	return fmt.Errorf("%w: %s has none", ErrUnsupported, runtime.GOOS)
}

// Pids fails: network namespaces are Linux's.
func (ns NS) Pids(context.Context) ([]int, error) {
	return nil, fmt.Errorf("%w: %s has none", ErrUnsupported, runtime.GOOS)
}

// KillAll fails: network namespaces are Linux's.
func (ns NS) KillAll(context.Context, func(int) bool) (int, error) {
	return 0, fmt.Errorf("%w: %s has none", ErrUnsupported, runtime.GOOS)
}
