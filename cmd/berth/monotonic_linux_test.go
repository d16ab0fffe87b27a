package main

import "golang.org/x/sys/unix"

// monotonic reads CLOCK_MONOTONIC in nanoseconds: one clock for every
// process of the host, which no step of the wall clock moves (tests of
// other packages step it).
func monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
