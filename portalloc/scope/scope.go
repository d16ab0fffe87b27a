// Package scope resolves the scopes of portalloc's Config.Scope and
// berth's --scope, and records labels in them, for programs that read or
// write the labels of a scope without an Allocator of that scope (a
// listing, a lookup by label).
//
// # Labels in a scope
//
// An Allocator with a Config.Scope records each Request.Label as
// Label(scope, label): the label, "@" and the scope ("web@/home/ana/src/shop"),
// so that sticky ports, sets and listings are the scope's own, and two
// scopes, two checkouts of one project say, may use the same labels side
// by side. Unscoped reads a recorded label back.
package scope

import (
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/scopes"
)

// The modes Config.Scope, BERTH_SCOPE and berth's --scope take besides a
// name of the caller's own.
const (
	// Git is the root of the git worktree the process runs in: the nearest
	// directory, from the working directory up, that holds a .git
	// directory (the main worktree) or a .git file (a worktree made by git
	// worktree add, or a submodule). Two worktrees of one repository are
	// two scopes.
	Git = scopes.Git
	// Dir is the process's working directory.
	Dir = scopes.Dir
)

// MaxLen is the longest scope, in bytes, once resolved. A label in a scope
// is recorded with the scope (see Label), and the two together must fit in
// store.MaxLabelLen.
const MaxLen = scopes.MaxLen

// Resolve returns the scope that s names for this process: the root of
// the current git worktree for Git, the working directory for Dir, and s
// itself for any other name; "" (no scope) for "". Paths are absolute,
// with symbolic links resolved, so that two ways to one directory are one
// scope. An Allocator resolves its Config.Scope so.
//
// It refuses, with a *portalloc.FieldError for the field "Config.Scope"
// wrapping portalloc.ErrInvalidRequest, a value that starts like a mode
// berth does not know (a word and a colon, such as "git:" or "env:X"), a
// name that is not printable UTF-8 or is longer than MaxLen, and Git
// outside a git worktree.
func Resolve(s string) (string, error) {
	sc, err := scopes.Resolve("Config.Scope", s)
	if err != nil {
		return "", &portalloc.OpError{Err: err}
	}
	return sc, nil
}

// Label returns the label a reservation or a sticky port records for label
// in scope: label itself in the empty scope, else label, "@" and the scope
// ("web@/home/ana/src/shop").
func Label(scope, label string) string { return scopes.Label(scope, label) }

// Unscoped returns the label that recorded, a label as a reservation
// records it, has in scope, and whether recorded belongs to scope at all
// ("" and false when it does not): recorded without "@" and scope for a
// scope, recorded itself for the empty scope when it has no "@" (a label
// with one belongs to a scope, or was given so on purpose: it is still
// found by its whole text, as berth port and live.PortOf look labels up).
func Unscoped(recorded, scope string) (string, bool) { return scopes.Unscoped(recorded, scope) }
