//go:build !linux

package portlock

func list() ([]Held, error) { return nil, nil }
