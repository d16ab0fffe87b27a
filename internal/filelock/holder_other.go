//go:build !linux

package filelock

// HolderOf returns the process that holds the lock on the file at path,
// where the OS can tell: not outside Linux, so ok is false.
func HolderOf(string) (h Holder, ok bool) { return Holder{}, false }

// Yield does nothing here: only Linux's waiters are measured to gain from
// it (see yield_linux.go).
func Yield() {}
