//go:build !race

package portalloc_test

const raceEnabled = false
