//go:build !linux

package filelock

// holderOf cannot tell a lock's holder outside Linux.
func holderOf(string) (Holder, bool) { return Holder{}, false }
