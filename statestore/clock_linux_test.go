package statestore_test

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-go/berth/internal/clocklock"
)

// takeClock gives a test, run as root, the wall clock to step: it waits
// for its turn among the programs that step it (internal/clocklock), and
// returns the true time, read from the monotonic clock, and a setter. A
// cleanup sets the true time back, should the test fail, and only then
// lets the next program step the clock.
func takeClock(tb testing.TB) (trueNow func() int64, setClock func(ns int64) error) {
	tb.Helper()
	if unix.Geteuid() != 0 {
		tb.Skip("stepping the wall clock needs root; run the tests as root to include it")
	}
	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	unlock, err := clocklock.Lock(lctx)
	if err != nil {
		tb.Skipf("another program has been stepping the clock for 2 minutes: %v", err)
	}
	tb.Cleanup(func() { _ = unlock() }) // after the clock is set back (cleanups run last first)
	var real0, mono0 unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono0)
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &real0)
	trueNow = func() int64 {
		var m unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &m)
		return real0.Nano() + m.Nano() - mono0.Nano()
	}
	setClock = func(ns int64) error {
		ts := unix.NsecToTimespec(ns)
		return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
	}
	tb.Cleanup(func() { _ = setClock(trueNow()) })
	return trueNow, setClock
}
