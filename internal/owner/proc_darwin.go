package owner

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

var host darwinKernel

// darwinKernel reads processes with the kern.proc.pid sysctl.
type darwinKernel struct{ flat }

// sZomb is SZOMB of <sys/proc.h>: exited, waiting for its parent.
const sZomb = 5

func (darwinKernel) read(_ context.Context, pid int) (reading, error) {
	k, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil {
		// For a pid without a process the sysctl answers nothing, which
		// x/sys reports as EIO: ask the kernel whether the pid exists.
		if !exists(pid) {
			return reading{}, errGone
		}
		return reading{}, err
	}
	if int(k.Proc.P_pid) != pid {
		return reading{}, fmt.Errorf("kern.proc.pid %d answered for pid %d", pid, k.Proc.P_pid)
	}
	// p_starttime is written once, when the process starts; milliseconds
	// are the unit earlier berth releases stored (see the package doc).
	t := k.Proc.P_starttime
	return reading{start: t.Sec*1000 + int64(t.Usec)/1000, exited: k.Proc.P_stat == sZomb}, nil
}

// leaseClock reads CLOCK_MONOTONIC, which on macOS counts time asleep too.
func leaseClock() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("owner: read CLOCK_MONOTONIC: %w", err)
	}
	return ts.Nano(), nil
}

// leaseBoot is the boot session's UUID, which changes at every boot; ""
// when it cannot be read.
var leaseBoot = sync.OnceValue(func() string {
	s, err := unix.Sysctl("kern.bootsessionuuid")
	if err != nil {
		return ""
	}
	return s
})
