//go:build windows

package safefs

import "os"

// noFollow: Windows opens reparse points as their targets; its per-user
// profile directories carry ACLs that keep other users out.
const noFollow = 0

func isLoop(error) bool { return false }

func checkOwner(string, os.FileInfo, bool) error { return nil }
