//go:build unix && !linux

package main

import (
	"os"
	"time"
)

// waitParent returns once the process ppid, this process's parent, has
// exited: an orphan is reparented, so the parent changes. These systems
// have no pidfd; a kqueue NOTE_EXIT would do on the BSDs and macOS, but the
// file's removal a fraction of a second late costs nothing.
func waitParent(ppid int) {
	for os.Getppid() == ppid {
		time.Sleep(200 * time.Millisecond)
	}
}
