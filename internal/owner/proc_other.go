//go:build !linux && !darwin && !windows

package owner

import (
	"context"
	"errors"

	"github.com/shirou/gopsutil/v4/process"
)

var host psKernel

// psKernel reads processes through gopsutil, whose CreateTime on the BSDs
// is the start the kernel recorded, in unix milliseconds.
type psKernel struct{ flat }

func (psKernel) read(ctx context.Context, pid int) (reading, error) {
	p, err := process.NewProcessWithContext(ctx, int32(pid))
	if err != nil {
		if errors.Is(err, process.ErrorProcessNotRunning) {
			return reading{}, errGone
		}
		return reading{}, err
	}
	start, err := p.CreateTimeWithContext(ctx)
	if err != nil {
		if ok, perr := process.PidExistsWithContext(ctx, p.Pid); perr == nil && !ok {
			return reading{}, errGone
		}
		return reading{}, err
	}
	st, err := p.StatusWithContext(ctx)
	return reading{start: start, exited: err == nil && len(st) > 0 && st[0] == process.Zombie}, nil
}
