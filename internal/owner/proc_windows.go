package owner

import (
	"context"
	"errors"

	"golang.org/x/sys/windows"
)

var host windowsKernel

// windowsKernel reads processes with OpenProcess and GetProcessTimes.
type windowsKernel struct{ flat }

// stillActive is STILL_ACTIVE, the exit code of a process that runs.
const stillActive = 259

func (windowsKernel) read(_ context.Context, pid int) (reading, error) {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		if errors.Is(err, windows.ERROR_INVALID_PARAMETER) {
			return reading{}, errGone // no process has this pid
		}
		// ERROR_ACCESS_DENIED is a process this one may not inspect: it
		// exists, and the caller counts it as alive.
		return reading{}, err
	}
	defer func() { _ = windows.CloseHandle(h) }()
	var created, exited, kernelTime, userTime windows.Filetime
	if err := windows.GetProcessTimes(h, &created, &exited, &kernelTime, &userTime); err != nil {
		return reading{}, err
	}
	// A handle held anywhere keeps an exited process's object, so OpenProcess
	// succeeds for it: its exit code tells. A process that exited with code
	// 259 passes for alive, the safe side.
	var code uint32
	gone := windows.GetExitCodeProcess(h, &code) == nil && code != stillActive
	// The creation time is written once, when the process starts;
	// milliseconds are the unit earlier berth releases stored (see the
	// package doc).
	return reading{start: created.Nanoseconds() / 1e6, exited: gone}, nil
}
