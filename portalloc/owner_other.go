//go:build !unix

package portalloc

// foreignOwner: where the OS has no uid 0 (Windows), there is no root to
// protect another user's home from.
func foreignOwner(string) (int, bool) { return 0, false }
