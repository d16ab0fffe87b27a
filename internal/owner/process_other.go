//go:build !linux

package owner

import (
	"context"
	"errors"
	"fmt"

	"github.com/shirou/gopsutil/v4/process"
)

// inspect reads pid through gopsutil: these systems show no Layout or Stdin.
func inspect(ctx context.Context, pid int) (Process, error) {
	p := &process.Process{Pid: int32(pid)} // validPID keeps pid within int32
	ppid, err := p.PpidWithContext(ctx)
	if err != nil {
		if ok, perr := process.PidExistsWithContext(ctx, p.Pid); perr == nil && !ok || errors.Is(err, process.ErrorProcessNotRunning) {
			return Process{}, fmt.Errorf("owner: pid %d: %w", pid, ErrNotRunning)
		}
		return Process{}, fmt.Errorf("owner: inspect pid %d: %w", pid, err)
	}
	pr := Process{PID: pid, PPID: int(ppid)}
	pr.Name, _ = p.NameWithContext(ctx)
	pr.Exe, _ = p.ExeWithContext(ctx)
	if args, err := p.CmdlineSliceWithContext(ctx); err == nil && len(args) > 0 {
		pr.Args = args
	}
	return pr, nil
}

// flat is the kernel part of systems without boot ids or pid namespaces,
// whose starts are unix milliseconds.
type flat struct{}

func (flat) scope() scope                         { return scope{} }
func (flat) wallMillis(start int64) (int64, bool) { return start, true }
func (flat) pidNSGone(string) bool                { return false }

// NameOf returns the name of process pid, for people to read, or "".
func NameOf(ctx context.Context, pid int) string {
	// Not process.NewProcess: it also reads the start time, which berth
	// reads from the kernel itself, and gopsutil derives it from a boot time
	// it works out by probing the machine.
	p := &process.Process{Pid: int32(pid)} // validPID keeps pid within int32
	n, _ := p.NameWithContext(ctx)
	return n
}
