//go:build !unix

package main

import (
	"context"
	"errors"
	"os"
)

// supervise: berth run --restart and --watch need process groups and
// descriptor inheritance by number, which this system does not have.
func (a *app) supervise(context.Context, string, []string, []string, []*os.File, *runFlags) error {
	return errors.New("berth run --restart and --watch are not available on this system")
}
