//go:build race

package portalloc_test

// raceEnabled is true when the race detector runs, which slows the tests
// that start many processes.
const raceEnabled = true
