//go:build !linux

package marker

import "errors"

// Supported reports whether marks exist on this system.
func Supported() bool { return false }

func bind(string) (closer, error) { return nil, errors.ErrUnsupported }

func boundNames() ([]string, error) { return nil, nil }
