//go:build !unix

package statestore

// writable reports false where it is not checked: a read-only connection
// is then reported as a file that may not be writable.
func writable(string) bool { return false }
