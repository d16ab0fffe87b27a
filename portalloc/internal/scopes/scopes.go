// Package scopes resolves scopes and records labels in them, for the core
// (Config.Scope, the labels a scoped Allocator records) and for package
// portalloc/scope, which offers the same to programs.
package scopes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/berth-go/berth/store"
)

// The scope modes besides a name of the caller's own.
const (
	// Git is the root of the git worktree the process runs in.
	Git = "git"
	// Dir is the process's working directory.
	Dir = "dir"
)

// MaxLen is the longest scope, in bytes, once resolved.
const MaxLen = 200

// Sep joins a label and its scope in the label a reservation records.
const Sep = "@"

// modeRE matches a scope that names a mode: a word of two or more letters,
// digits or dashes and a colon ("git:", "env:NAME"). Such values are kept
// for modes; one berth does not know is refused rather than taken as a
// name, so that a mode a later berth adds never means something else to an
// earlier one. One letter and a colon is a Windows drive ("C:\src").
var modeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]+:`)

// want says what a scope may be, for error messages.
const want = `"git" (the root of the current git worktree), "dir" (the current directory), or a name of your own: printable UTF-8 of at most 200 bytes that does not start with a word of two or more letters and a colon ("git:", "env:X"), which are kept for modes`

// Resolve returns the scope that s names for this process: the root of the
// current git worktree for Git, the working directory for Dir, and s
// itself for any other name; "" for "". Paths are absolute, with symbolic
// links resolved. It refuses bad input with a *store.FieldError for field
// (the field, variable or flag that gave s), which wraps store.ErrInvalid.
func Resolve(field, s string) (string, error) {
	bad := func(w string) error {
		return &store.FieldError{Field: field, Value: s, Want: w}
	}
	switch {
	case s == "":
		return "", nil
	case s == Git:
		dir, err := workDir()
		if err != nil {
			return "", bad(want + "; the working directory cannot be read: " + err.Error())
		}
		root, ok := gitRoot(dir)
		if !ok {
			return "", bad(fmt.Sprintf("%s; %q is in no git worktree (no .git in it or any directory above it): run berth inside the checkout, or give a name", want, dir))
		}
		return checkLen(field, s, root)
	case s == Dir:
		dir, err := workDir()
		if err != nil {
			return "", bad(want + "; the working directory cannot be read: " + err.Error())
		}
		return checkLen(field, s, dir)
	case modeRE.MatchString(s):
		mode, _, _ := strings.Cut(s, ":")
		return "", bad(fmt.Sprintf("%s; %q is not a scope mode berth knows", want, mode+":"))
	}
	if err := store.CheckLabel(s); err != nil {
		var fe *store.FieldError
		if errors.As(err, &fe) {
			_, why, _ := strings.Cut(fe.Want, "; ") // what CheckLabel found: "it has '\x1b' at byte 3"
			return "", bad(want + "; " + why)
		}
		return "", bad(want)
	}
	return checkLen(field, s, s)
}

func checkLen(field, given, scope string) (string, error) {
	if len(scope) > MaxLen {
		return "", &store.FieldError{Field: field, Value: given,
			Want: fmt.Sprintf("%s; %q has %d bytes: give a shorter name", want, scope, len(scope))}
	}
	return scope, nil
}

// workDir is the working directory with symbolic links resolved.
func workDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return dir, nil
}

// gitRoot returns the nearest directory from dir up that holds .git, a
// directory or a file, as git rev-parse --show-toplevel finds a worktree's
// root without running git.
func gitRoot(dir string) (string, bool) {
	for {
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
			return dir, true
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", false
		}
		dir = up
	}
}

// Label returns the label recorded for label in scope: label itself in
// the empty scope, else label, Sep and the scope.
func Label(scope, label string) string {
	if scope == "" {
		return label
	}
	return label + Sep + scope
}

// Unscoped returns the label that recorded has in scope, and whether
// recorded belongs to scope at all ("" and false when it does not).
func Unscoped(recorded, scope string) (string, bool) {
	if scope == "" {
		if recorded == "" || strings.Contains(recorded, Sep) {
			return "", false
		}
		return recorded, true
	}
	label, ok := strings.CutSuffix(recorded, Sep+scope)
	if !ok || label == "" {
		return "", false
	}
	return label, true
}
