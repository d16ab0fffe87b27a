//go:build !linux

package statestore_test

import "errors"

func freeBytes(string) (int64, error) { return 0, errors.New("free space is read on Linux only") }
