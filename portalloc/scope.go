package portalloc

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/berth-go/berth/store"
)

// A scope keeps the labels and sticky ports of one checkout (or one name)
// apart from another's: the label a reservation records is LABEL@SCOPE
// (scopeSep), so that "api" of two worktrees of a project are two labels.

// scopeSep joins a label and its scope in the label a reservation records.
const scopeSep = "@"

// maxScopeLen is the longest scope, in bytes, once resolved.
const maxScopeLen = 200

// modeRE matches a scope that names a mode: a word of two or more letters,
// digits or dashes and a colon ("git:", "env:NAME"). Such values are kept
// for modes; one berth does not know is refused rather than taken as a
// name, so that a mode a later berth adds never means something else to an
// earlier one. One letter and a colon is a Windows drive ("C:\src").
var modeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]+:`)

// scopeWant says what a scope may be, for error messages.
const scopeWant = `"git" (the root of the current git worktree), "dir" (the current directory), or a name of your own: printable UTF-8 of at most 200 bytes that does not start with a word of two or more letters and a colon ("git:", "env:X"), which are kept for modes`

// ResolveScope returns the scope s names for this process, as New resolves
// Config.Scope: the root of the current git worktree for "git", the
// working directory for "dir", and s itself for any other name; "" for "".
// Paths are absolute, with symbolic links resolved. A scope it refuses is a
// *store.FieldError for "scope".
func ResolveScope(s string) (string, error) { return resolveScope("scope", s) }

func resolveScope(field, s string) (string, error) {
	bad := func(w string) error {
		return &store.FieldError{Field: field, Value: s, Want: w}
	}
	switch {
	case s == "":
		return "", nil
	case s == "git", s == "dir":
		dir, err := os.Getwd()
		if real, rerr := filepath.EvalSymlinks(dir); err == nil && rerr == nil {
			dir = real
		}
		if err != nil {
			return "", bad(scopeWant + "; the working directory cannot be read: " + err.Error())
		}
		if s == "git" {
			root, ok := gitRoot(dir)
			if !ok {
				return "", bad(fmt.Sprintf("%s; %q is in no git worktree (no .git in it or any directory above it): run berth inside the checkout, or give a name", scopeWant, dir))
			}
			dir = root
		}
		return checkScopeLen(field, s, dir)
	case modeRE.MatchString(s):
		mode, _, _ := strings.Cut(s, ":")
		return "", bad(fmt.Sprintf("%s; %q is not a scope mode berth knows", scopeWant, mode+":"))
	}
	if err := store.CheckLabel(s); err != nil {
		var fe *store.FieldError
		if errors.As(err, &fe) {
			_, why, _ := strings.Cut(fe.Want, "; ") // what CheckLabel found
			return "", bad(scopeWant + "; " + why)
		}
		return "", bad(scopeWant)
	}
	return checkScopeLen(field, s, s)
}

func checkScopeLen(field, given, resolved string) (string, error) {
	if len(resolved) > maxScopeLen {
		return "", &store.FieldError{Field: field, Value: given, Want: fmt.Sprintf("%s; it resolves to %d bytes", scopeWant, len(resolved))}
	}
	return resolved, nil
}

// gitRoot returns the top of the git worktree dir is in: the nearest
// directory at or above dir that holds .git (a directory, or a file in a
// linked worktree or submodule).
func gitRoot(dir string) (string, bool) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			return d, true
		}
		if d == filepath.Dir(d) {
			return "", false
		}
	}
}

// scopeLabel records label in scope; "" stays "".
func scopeLabel(scope, label string) string {
	if scope == "" || label == "" {
		return label
	}
	return label + scopeSep + scope
}

// scopeSeed returns the random source of the order in which a labelled
// request of a scope tries the range: seeded by the scope and the label,
// so that a label's first port in a scope is the same on every machine
// while it is free, and two scopes, or two labels, rarely start at the same
// port. A scope that is a path (git, dir) counts by its last element, the
// checkout's directory name, which is the same for the same project on
// another machine while the rest of the path is not. nil for a request
// without a scope or a label: the Allocator's own random order.
func scopeSeed(scope, label string) *rand.Rand {
	if scope == "" || label == "" {
		return nil
	}
	name := scope
	if filepath.IsAbs(name) {
		name = filepath.Base(name)
	}
	h := fnv.New128a()
	_, _ = h.Write([]byte(name))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(label))
	sum := h.Sum(nil)
	var hi, lo uint64
	for i := range 8 {
		hi = hi<<8 | uint64(sum[i])
		lo = lo<<8 | uint64(sum[8+i])
	}
	return rand.New(rand.NewPCG(hi, lo))
}
