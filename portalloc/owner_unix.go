//go:build unix

package portalloc

import (
	"os"
	"path/filepath"
	"syscall"
)

// foreignOwner reports whether path, or a directory above it that exists,
// belongs to a user other than root, and which: a directory root creates
// there would be root's inside that user's tree. The root directory itself
// is not looked at.
func foreignOwner(path string) (uid int, foreign bool) {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if p == filepath.Dir(p) {
			return 0, false
		}
		fi, err := os.Stat(p) // the directory a symbolic link leads to is what root writes in
		if err != nil {
			continue // not there yet: root would create it
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			return int(st.Uid), true
		}
	}
}
