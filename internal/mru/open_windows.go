//go:build windows

package mru

// Windows has neither flag; it has no FIFOs in the file system, and the
// state directory's ACLs keep other users from planting links.
const (
	noFollow = 0
	nonBlock = 0
)
