//go:build race

package portlock_test

const raceEnabled = true
