//go:build !linux

package filelock

// Yield does nothing here: only Linux's waiters are measured to gain from
// it (see yield_linux.go).
func Yield() {}
