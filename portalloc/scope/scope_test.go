package scope_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/scope"
)

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      string // a part of the error, for input refused
	}{
		{in: "", want: ""},
		{in: "shop", want: "shop"},
		{in: "my shop/feature-x", want: "my shop/feature-x"},
		{in: `C:\src\shop`, want: `C:\src\shop`}, // a drive letter is no mode
		{in: "git:", bad: `"git:" is not a scope mode berth knows`},
		{in: "env:SHOP", bad: `"env:" is not a scope mode berth knows`},
		{in: "https://example.com/shop", bad: `"https:" is not a scope mode`},
		{in: "shop\x1b[2J", bad: `it has '\x1b' at byte 4`},
		{in: strings.Repeat("s", scope.MaxLen+1), bad: "has 201 bytes: give a shorter name"},
	} {
		got, err := scope.Resolve(tc.in)
		if tc.bad == "" {
			if err != nil || got != tc.want {
				t.Errorf("Resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
			continue
		}
		var fe *portalloc.FieldError
		if !errors.As(err, &fe) || fe.Field != "Config.Scope" || !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.bad) {
			t.Errorf("Resolve(%q) = %q, %v; want a *FieldError for Config.Scope wrapping ErrInvalidRequest that says %q", tc.in, got, err, tc.bad)
		}
	}
}

// TestResolveGitAndDir: "git" is the nearest directory up that holds
// .git (a file in a linked worktree), "dir" the working directory; outside
// a worktree "git" is refused.
func TestResolveGitAndDir(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wt := filepath.Join(root, "wt")
	sub := filepath.Join(wt, "cmd", "server")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wt, ".git"), []byte("gitdir: /elsewhere/.git/worktrees/wt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	if got, err := scope.Resolve(scope.Git); got != wt || err != nil {
		t.Errorf("Resolve(git) in %s = %q, %v; want %q", sub, got, err, wt)
	}
	if got, err := scope.Resolve(scope.Dir); got != sub || err != nil {
		t.Errorf("Resolve(dir) in %s = %q, %v; want %q", sub, got, err, sub)
	}
	t.Chdir(root)
	if got, err := scope.Resolve(scope.Git); err == nil || !strings.Contains(err.Error(), "is in no git worktree") {
		t.Errorf("Resolve(git) in %s = %q, %v; want an error that says it is in no git worktree", root, got, err)
	}
}

func TestLabel(t *testing.T) {
	for _, tc := range []struct {
		scope, label, recorded string
	}{
		{"", "web", "web"},
		{"shop", "web", "web@shop"},
		{"/home/ana/src/shop", "run/port/web", "run/port/web@/home/ana/src/shop"},
		{"shop", "api@v2", "api@v2@shop"},
	} {
		if got := scope.Label(tc.scope, tc.label); got != tc.recorded {
			t.Errorf("Label(%q, %q) = %q; want %q", tc.scope, tc.label, got, tc.recorded)
		}
		if got, ok := scope.Unscoped(tc.recorded, tc.scope); got != tc.label || !ok {
			t.Errorf("Unscoped(%q, %q) = %q, %v; want %q, true", tc.recorded, tc.scope, got, ok, tc.label)
		}
	}
	for _, tc := range []struct{ recorded, scope string }{
		{"web@shop", ""},      // a label of a scope is not the empty scope's
		{"web@shop", "shop2"}, // nor another scope's
		{"web@shop", "hop"},   // a scope is matched whole
		{"@shop", "shop"},     // no label
		{"web", "shop"},       // the empty scope's
		{"", ""},              // no label at all
	} {
		if got, ok := scope.Unscoped(tc.recorded, tc.scope); ok {
			t.Errorf("Unscoped(%q, %q) = %q, true; want false", tc.recorded, tc.scope, got)
		}
	}
}
