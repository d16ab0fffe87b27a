//go:build !linux

package main

import (
	"context"
	"fmt"
	"time"
)

// monotonic falls back to the wall clock where the harness knows no clock shared by every
// process that no one steps. Runs there cannot step the clock, so only an administrator
// or NTP could confuse their order.
func monotonic() int64 { return time.Now().UnixNano() }

// canStepClock reports whether this platform has a clock stepper.
const canStepClock = false

type clockStepper struct{}

func startClockStepper(context.Context) (*clockStepper, error) {
	return nil, fmt.Errorf("torture: stepping the system clock is implemented for Linux only")
}

func (*clockStepper) step(func(offset, frac time.Duration) time.Duration) (time.Duration, error) {
	return 0, nil
}

func (*clockStepper) close() error { return nil }

// canPressure reports whether this platform can run -fd-pressure.
const canPressure = false

func countOpen() (int, error) { return 0, errNoPressure }

func lowerNoFile(uint64) (func() error, error) { return nil, errNoPressure }
