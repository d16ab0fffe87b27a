//go:build !linux

package marker

import "errors"

// Supported reports whether marks exist on this system.
func Supported() bool { return false }

func limit() int { return 0 }

func bind(string) (closer, error) { return nil, errors.ErrUnsupported }

func boundNames() ([]string, error) { return nil, nil }

func inherit(c closer) (closer, error) { return c, nil }
