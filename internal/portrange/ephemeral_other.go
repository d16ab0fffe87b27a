//go:build !linux && !darwin && !windows

package portrange

func ephemeralRange() (Range, error) { return IANADynamic, nil }

func reservedRanges() ([]Range, error) { return nil, nil }
