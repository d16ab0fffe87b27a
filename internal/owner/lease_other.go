//go:build !linux && !darwin

package owner

import "time"

// leaseClock is the wall clock: these systems offer berth no clock since
// boot that counts suspend (see LeaseNow).
func leaseClock() (int64, error) { return time.Now().UnixNano(), nil }

func leaseBoot() string { return "" }
