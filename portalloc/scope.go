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

// The scope modes Config.Scope, BERTH_SCOPE and berth's --scope take
// besides a name of the caller's own.
const (
	// ScopeGit is the root of the git worktree the process runs in: the
	// nearest directory, from the working directory up, that holds a .git
	// directory (the main worktree) or a .git file (a worktree made by git
	// worktree add, or a submodule). Two worktrees of one repository are
	// two scopes.
	ScopeGit = "git"
	// ScopeDir is the process's working directory.
	ScopeDir = "dir"
)

// MaxScopeLen is the longest scope, in bytes, once resolved. A label in a
// scope is recorded with the scope (see ScopedLabel), and the two together
// must fit in store.MaxLabelLen.
const MaxScopeLen = 200

// scopeSep joins a label and its scope in the label a reservation records.
const scopeSep = "@"

// modeRE matches a scope that names a mode: a word of two or more letters,
// digits or dashes and a colon ("git:", "env:NAME"). Such values are kept
// for modes; one berth does not know is refused rather than taken as a
// name, so that a mode a later berth adds never means something else to an
// earlier one. One letter and a colon is a Windows drive ("C:\src").
var modeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]+:`)

// scopeWant says what a scope may be, for error messages.
const scopeWant = `"git" (the root of the current git worktree), "dir" (the current directory), or a name of your own: printable UTF-8 of at most 200 bytes that does not start with a word of two or more letters and a colon ("git:", "env:X"), which are kept for modes`

// ResolveScope returns the scope that s names for this process: the root of
// the current git worktree for ScopeGit, the working directory for
// ScopeDir, and s itself for any other name; "" (no scope) for "". Paths
// are absolute, with symbolic links resolved, so that two ways to one
// directory are one scope.
//
// It refuses, with a *FieldError for the field "Config.Scope" wrapping
// ErrInvalidRequest, a value that starts like a mode berth does not know
// (a word and a colon, such as "git:" or "env:X"), a name that is not
// printable UTF-8 or is longer than MaxScopeLen, and ScopeGit outside a
// git worktree.
func ResolveScope(s string) (string, error) {
	scope, err := resolveScope("Config.Scope", s)
	return scope, opError("", err)
}

// resolveScope is ResolveScope with the field (or variable, or flag) that
// gave s named in the error.
func resolveScope(field, s string) (string, error) {
	bad := func(want string) error {
		return &FieldError{Field: field, Value: s, Want: want}
	}
	switch {
	case s == "":
		return "", nil
	case s == ScopeGit:
		dir, err := workDir()
		if err != nil {
			return "", bad(scopeWant + "; the working directory cannot be read: " + err.Error())
		}
		root, ok := gitRoot(dir)
		if !ok {
			return "", bad(fmt.Sprintf("%s; %q is in no git worktree (no .git in it or any directory above it): run berth inside the checkout, or give a name", scopeWant, dir))
		}
		return checkScopeLen(field, s, root)
	case s == ScopeDir:
		dir, err := workDir()
		if err != nil {
			return "", bad(scopeWant + "; the working directory cannot be read: " + err.Error())
		}
		return checkScopeLen(field, s, dir)
	case modeRE.MatchString(s):
		mode, _, _ := strings.Cut(s, ":")
		return "", bad(fmt.Sprintf("%s; %q is not a scope mode berth knows", scopeWant, mode+":"))
	}
	if err := store.CheckLabel(s); err != nil {
		var fe *store.FieldError
		if errors.As(err, &fe) {
			_, why, _ := strings.Cut(fe.Want, "; ") // what CheckLabel found: "it has '\x1b' at byte 3"
			return "", bad(scopeWant + "; " + why)
		}
		return "", bad(scopeWant)
	}
	return checkScopeLen(field, s, s)
}

func checkScopeLen(field, given, scope string) (string, error) {
	if len(scope) > MaxScopeLen {
		return "", &FieldError{Field: field, Value: given,
			Want: fmt.Sprintf("%s; %q has %d bytes: give a shorter name", scopeWant, scope, len(scope))}
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

// ScopedLabel returns the label a reservation or a sticky port records for
// label in scope: label itself in the empty scope, else label, "@" and the
// scope ("web@/home/ana/src/shop"). An Allocator with a Config.Scope
// records every Request.Label this way, so that sticky ports, sets and
// listings are the scope's own, and two scopes may use the same labels.
func ScopedLabel(scope, label string) string {
	if scope == "" {
		return label
	}
	return label + scopeSep + scope
}

// UnscopedLabel returns the label that recorded, a label as a reservation
// records it, has in scope, and whether recorded belongs to scope at all
// ("" and false when it does not): recorded without "@" and scope for a
// scope, recorded itself for the empty scope when it has no "@" (a label
// with one belongs to a scope, or was given so on purpose: it is still
// found by its whole text, as berth port and PortOf look labels up).
func UnscopedLabel(recorded, scope string) (string, bool) {
	if scope == "" {
		if recorded == "" || strings.Contains(recorded, scopeSep) {
			return "", false
		}
		return recorded, true
	}
	label, ok := strings.CutSuffix(recorded, scopeSep+scope)
	if !ok || label == "" {
		return "", false
	}
	return label, true
}

// scopeLabel records req's label in the Allocator's scope, and checks that
// the two fit in a label.
func (a *Allocator) scopeLabel(req Request) (Request, error) {
	if a.cfg.Scope == "" || req.Label == "" {
		return req, nil
	}
	l := ScopedLabel(a.cfg.Scope, req.Label)
	if len(l) > store.MaxLabelLen {
		return Request{}, &FieldError{Field: "Request.Label", Value: req.Label,
			Want: fmt.Sprintf("at most %d bytes together with the scope %q and %q (%d bytes now): a shorter label or scope", store.MaxLabelLen, a.cfg.Scope, scopeSep, len(l))}
	}
	req.Label = l
	return req, nil
}

// scopeSeed returns the random source of the order in which a labelled
// request of a scope tries the range: seeded by the scope and the label, so
// that a label's first port in a scope is the same on every machine while
// it is free, and two scopes, or two labels, rarely start at the same
// port. A scope that is a path (ScopeGit, ScopeDir) counts by its last
// element, the checkout's directory name, which is the same for the same
// project on another machine while the rest of the path is not. nil for a
// request without a scope or a label: the Allocator's own random order.
func (a *Allocator) scopeSeed(req Request) *rand.Rand {
	if a.cfg.Scope == "" || req.Label == "" {
		return nil
	}
	label, ok := UnscopedLabel(req.Label, a.cfg.Scope)
	if !ok {
		return nil
	}
	name := a.cfg.Scope
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
