//go:build !linux

package main

// canPressure reports whether this platform can run -fd-pressure.
const canPressure = false

func countOpen() (int, error) { return 0, errNoPressure }

func lowerNoFile(uint64) (func() error, error) { return nil, errNoPressure }
