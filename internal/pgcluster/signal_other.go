//go:build !unix

package pgcluster

import "errors"

var errNoSignals = errors.New("processes cannot be stopped and resumed on this system")

func stop(int) error { return errNoSignals }

func cont(int) error { return errNoSignals }
