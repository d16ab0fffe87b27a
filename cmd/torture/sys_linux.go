package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-go/berth/internal/clocklock"
)

// monotonic reads CLOCK_MONOTONIC: one clock for every process of the host
// (of its time namespace, which a run never leaves), counting from boot,
// never stepped. Go's own monotonic readings count from each process's
// start, so they order events within a process only.
func monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC exists on every kernel Go runs on.
		panic("torture: read CLOCK_MONOTONIC: " + err.Error())
	}
	return ts.Nano()
}

const canStepClock = true

// clockStepper steps CLOCK_REALTIME and puts it back. The true time is
// kept as an anchor, a wall and a monotonic reading taken together at the
// start: later it is the anchor's wall time plus the monotonic time since,
// which no step moves. Restoring sets exactly that, however many steps
// were made.
//
// An anchor taken while another program has the clock stepped would make
// a wrong time the "true" one, and restoring it would leave the host's
// clock off for good. So a stepper holds the clocklock from before it
// reads the anchor until it has set the true time back, and two runs (or a
// run and a test that steps the clock) step it one after the other.
//
// A clockStepper is safe for concurrent use.
type clockStepper struct {
	mu     sync.Mutex    // guards offset and done, and orders the settime calls
	unlock func() error  // lets go of the clocklock, held from the anchor until close
	wall0  int64         // CLOCK_REALTIME at the anchor, nanoseconds
	mono0  int64         // CLOCK_MONOTONIC at the anchor, nanoseconds
	offset time.Duration // how far CLOCK_REALTIME is off the true time
	done   bool          // closed: the true time is back and the lock released
}

// startClockStepper waits (as long as ctx allows) for the clocklock, takes
// the anchor and proves, by setting the clock to the time it shows, that
// this process may step it. It returns an error wrapping ErrNeedsRoot
// when it may not.
func startClockStepper(ctx context.Context) (*clockStepper, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("torture: %w (running as uid %d)", ErrNeedsRoot, os.Geteuid())
	}
	unlock, err := clocklock.Lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("torture: %w", err)
	}
	var wall unix.Timespec
	m0 := monotonic()
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &wall); err != nil {
		_ = unlock()
		return nil, fmt.Errorf("torture: read CLOCK_REALTIME: %w", err)
	}
	m1 := monotonic()
	c := &clockStepper{unlock: unlock, wall0: wall.Nano(), mono0: m0 + (m1-m0)/2}
	if err := c.set(0); err != nil {
		_ = unlock()
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("torture: %w: %w", ErrNeedsRoot, err)
		}
		return nil, err
	}
	return c, nil
}

// truth is the true wall time now, unix nanoseconds.
func (c *clockStepper) truth() int64 { return c.wall0 + (monotonic() - c.mono0) }

// set sets CLOCK_REALTIME to the true time plus offset. The caller holds
// mu, or owns c alone.
func (c *clockStepper) set(offset time.Duration) error {
	ts := unix.NsecToTimespec(c.truth() + int64(offset))
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("torture: set CLOCK_REALTIME: %w", err)
	}
	return nil
}

// step moves CLOCK_REALTIME by what choose returns, given how far the
// clock is off the true time and the fraction of a second it shows.
func (c *clockStepper) step(choose func(offset, frac time.Duration) time.Duration) (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return 0, errors.New("torture: clock stepper closed")
	}
	shown := c.truth() + int64(c.offset)
	d := choose(c.offset, time.Duration(shown%int64(time.Second)))
	if err := c.set(c.offset + d); err != nil {
		return 0, err
	}
	c.offset += d
	return d, nil
}

// close sets CLOCK_REALTIME back to the true time and lets go of the
// clocklock. Later calls do nothing: the clock may be someone else's by
// then.
func (c *clockStepper) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	if err := c.set(0); err != nil {
		// Keep the lock: the clock is still off, and the caller may try
		// again (a deferred close does).
		return err
	}
	c.offset, c.done = 0, true
	return c.unlock()
}

const canPressure = true

// countOpen counts the process's open descriptors, less the one it opens
// to count them.
func countOpen() (int, error) {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	return len(names) - 1, nil
}

// lowerNoFile sets the soft RLIMIT_NOFILE to limit, keeping the hard
// limit, and returns the function that sets the old one back.
func lowerNoFile(limit uint64) (restore func() error, err error) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		return nil, fmt.Errorf("getrlimit: %w", err)
	}
	low := syscall.Rlimit{Cur: min(limit, old.Cur), Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		return nil, fmt.Errorf("setrlimit %d: %w", limit, err)
	}
	return func() error { return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) }, nil
}
