package owner

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

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
