package porttest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/statedir"
)

// stateDir returns the state directory porttest uses when BERTH_STATE_DIR
// is not set: "" for portalloc's default when it can be had, else a
// directory of this user's under the temporary directory, and why.
//
// Sandboxes (Nix, Bazel) and minimal CI containers run tests without a
// HOME, or with one that cannot be written, where net.Listen(":0") still
// works. The test binaries of one run still share a store there, as long
// as they share a temporary directory. portalloc itself keeps refusing
// without a default (its reservations must outlive the program that made
// them, and a temporary directory may be cleaned under them); a test run
// is over long before that.
func stateDir() (dir, why string, err error) {
	def, err := statedir.Default()
	switch {
	case err != nil:
		why = err.Error()
	default:
		werr := writable(def)
		if werr == nil {
			return "", "", nil
		}
		why = fmt.Sprintf("the default state directory %s cannot be used (%v)", def, werr)
	}
	dir, err = tempStateDir()
	if err != nil {
		return "", "", fmt.Errorf("%s, nor %w", why, err)
	}
	return dir, why, nil
}

// writable reports whether dir can be created and written: it is, or its
// nearest existing ancestor is, a directory this process may write.
func writable(dir string) error {
	at := dir
	for {
		fi, err := os.Stat(at)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s is not a directory", at)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		up := filepath.Dir(at)
		if up == at {
			return err
		}
		at = up
	}
	probe, err := os.MkdirTemp(at, ".berth-probe-")
	if err != nil {
		return err
	}
	return os.Remove(probe)
}

// tempStateDir returns os.TempDir()/berth-<uid>, created with mode 0700
// when it is missing. It must be a directory of this user's that no one
// else may write, and not a symbolic link: anyone may create a name in the
// temporary directory, so one made there by another user is refused, as
// package safefs refuses a state directory.
func tempStateDir() (string, error) {
	name := "berth"
	if uid := os.Getuid(); uid >= 0 { // -1 on Windows, whose temporary directory is the user's own
		name += "-" + strconv.Itoa(uid)
	}
	dir := filepath.Join(os.TempDir(), name)
	if err := safefs.CheckFile(dir); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(dir)
	switch {
	case err != nil:
		return "", err
	case !fi.IsDir():
		return "", fmt.Errorf("%s is not a directory; remove it, or set %s", dir, portalloc.EnvStateDir)
	}
	if err := safefs.CheckFile(dir); err != nil {
		return "", err
	}
	return dir, nil
}
