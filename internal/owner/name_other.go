//go:build !linux

package owner

import (
	"context"

	"github.com/shirou/gopsutil/v4/process"
)

// name returns the name of process pid, or "" when it cannot be read. A name
// is for people; its absence changes nothing.
func name(ctx context.Context, pid int) string {
	// Not process.NewProcess: it also reads the start time, which berth
	// reads from the kernel itself, and gopsutil derives it from a boot time
	// it works out by probing the machine.
	p := &process.Process{Pid: int32(pid)} // validPID keeps pid within int32
	n, _ := p.NameWithContext(ctx)
	return n
}
