//go:build !unix

package statestore

// writable reports false: a read-only connection is reported as a file
// that may not be writable.
func writable(string) bool { return false }
