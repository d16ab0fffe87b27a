//go:build unix

package safefs

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Never through a link, and never waiting for a writer when something put a
// FIFO in the file's place.
const noFollow = syscall.O_NOFOLLOW | syscall.O_NONBLOCK

func isLoop(err error) bool { return errors.Is(err, syscall.ELOOP) }

func checkOwner(path string, fi os.FileInfo, dir bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	me := os.Geteuid()
	what := "file"
	if dir {
		what = "directory"
	}
	if int(st.Uid) != me {
		return &UnsafeError{
			Path: path,
			Why:  fmt.Sprintf("is owned by uid %d, not by uid %d (this process)", st.Uid, me),
			Fix:  fmt.Sprintf("another user could change what berth reads there: use a state %s of your own (BERTH_STATE_DIR), or chown it if it is yours", what),
		}
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return &UnsafeError{
			Path: path,
			Why:  fmt.Sprintf("may be written by its group or by others (mode %04o)", fi.Mode().Perm()),
			Fix:  fmt.Sprintf("chmod go-w %s", path),
		}
	}
	return nil
}
