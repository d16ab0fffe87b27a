package owner

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// leaseClock reads CLOCK_BOOTTIME: time since boot, suspend included.
func leaseClock() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("owner: read CLOCK_BOOTTIME: %w", err)
	}
	return ts.Nano(), nil
}

// leaseBoot is the boot id of process scopes.
func leaseBoot() string { return host.scope().boot }
