//go:build !linux && !darwin

package owner

import "time"

// leaseClock is the wall clock, in unix nanoseconds: these systems offer
// berth no clock since boot that counts suspend. A wall-clock step moves
// the end of every lease by as much (see LeaseNow).
func leaseClock() (int64, error) { return time.Now().UnixNano(), nil }

// leaseBoot is "": the wall clock needs no boot to be read against.
func leaseBoot() string { return "" }
