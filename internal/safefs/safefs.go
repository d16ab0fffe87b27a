// Package safefs checks and creates the files of a state directory the way
// ssh treats ~/.ssh: a directory or file that another user owns, that others
// may write, or a symbolic link where berth creates files, is refused, so
// that nobody else can swap in a database, point a lock file somewhere else,
// or read what a user holds.
//
// The directory itself may be reached through a symbolic link (a home's
// .cache often is); what counts is the directory it resolves to. Files in it
// are never followed.
package safefs

import (
	"errors"
	"fmt"
	"os"
)

// ErrUnsafe is wrapped by every refusal of this package.
var ErrUnsafe = errors.New("unsafe state file or directory")

// ErrNoDir is wrapped by PrepareDir's error when the directory does not
// exist and cannot be created, or cannot be read: a mistake of
// configuration (a typo, a path of another machine), never a passing one.
var ErrNoDir = errors.New("state directory cannot be used")

// UnsafeError says which path was refused, why, and what fixes it.
type UnsafeError struct {
	Path string
	Why  string // e.g. "is owned by uid 1001, not by uid 0 (this process)"
	Fix  string // what the user can do
}

func (e *UnsafeError) Error() string { return fmt.Sprintf("%s %s; %s", e.Path, e.Why, e.Fix) }

// Unwrap returns ErrUnsafe.
func (e *UnsafeError) Unwrap() error { return ErrUnsafe }

// PrepareDir creates dir (mode 0700, parents as needed) when it does not
// exist, and checks that it is a directory owned by this process's user
// that no one else may write.
func PrepareDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("%w: create %s: %w", ErrNoDir, dir, err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoDir, err)
	}
	if !fi.IsDir() {
		return &UnsafeError{Path: dir, Why: "is not a directory", Fix: "remove it or choose another state directory (BERTH_STATE_DIR)"}
	}
	return checkOwner(dir, fi, true)
}

// CheckFile checks the file at path before berth opens or creates it: it
// may be missing; otherwise it must not be a symbolic link, and must be
// owned by this process's user and writable by no one else. Whether it is
// the kind of file the caller wants (a regular file, not a directory) is
// the caller's to check, with its own words for it.
func CheckFile(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return &UnsafeError{Path: path, Why: "is a symbolic link where berth keeps its own file", Fix: "remove the link; berth creates the file itself"}
	}
	return checkOwner(path, fi, fi.IsDir())
}

// OpenFile opens path like os.OpenFile, but never through a symbolic link
// in its last component nor blocking on a FIFO, and checks what it opened
// like CheckFile; it must be a regular file.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	if err := CheckFile(path); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, flag|noFollow, perm)
	if err != nil {
		if isLoop(err) {
			return nil, &UnsafeError{Path: path, Why: "is a symbolic link where berth keeps its own file", Fix: "remove the link; berth creates the file itself"}
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &UnsafeError{Path: path, Why: fmt.Sprintf("is not a regular file (%s)", fi.Mode().Type()), Fix: "remove it; berth creates the file itself"}
	}
	if err == nil {
		err = checkOwner(path, fi, false)
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}
