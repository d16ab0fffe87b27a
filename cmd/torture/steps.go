package main

import (
	"errors"
	"math/rand/v2"
	"time"
)

// ErrNeedsRoot is wrapped by Run's error when Config.ClockStep is set and
// the process may not set the system clock.
var ErrNeedsRoot = errors.New("stepping the system clock needs root (CAP_SYS_TIME); run as root, or turn clock stepping off")

// errNoFreeze is Run's error when Config.Freeze is set on an OS without
// SIGSTOP.
var errNoFreeze = errors.New("torture: freezing workers needs SIGSTOP, which this OS does not have")

// bigStep is the large clock step, either way: far beyond any tolerance
// for clock readings that differ by a tick.
const bigStep = 300 * time.Second

// nextStep picks the next step of the wall clock, given how far it is off
// the true time and the fraction of a second it shows: half the time
// bigStep forward or back (back towards the true time once it is bigStep
// off, so the clock never wanders further), otherwise 0.5-0.9 s in a
// direction that crosses a second boundary, which changes every reading
// truncated to whole seconds (as /proc/stat's btime is).
func nextStep(rng *rand.Rand, offset, frac time.Duration) time.Duration {
	if rng.IntN(2) == 0 {
		switch {
		case offset >= bigStep:
			return -bigStep
		case offset <= -bigStep:
			return bigStep
		case rng.IntN(2) == 0:
			return bigStep
		default:
			return -bigStep
		}
	}
	m := 500*time.Millisecond + time.Duration(rng.IntN(400))*time.Millisecond
	up := frac+m >= time.Second // forward into the next second
	down := frac < m            // back into the previous one
	// m >= 0.5 s: when up fails, frac < 1 s - m <= m, so down holds.
	if up && (!down || rng.IntN(2) == 0) {
		return m
	}
	return -m
}
