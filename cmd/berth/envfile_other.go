//go:build !unix

package main

import "errors"

// writeEnvFile: berth run is not available without exec.
func writeEnvFile(string, []string) error {
	return errors.New("--env-file: berth run is not available on this system")
}

func watchEnvFile([]string) int { return exitFailure }
