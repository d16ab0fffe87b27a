//go:build unix && !darwin && !ios

package portalloc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// freshHome points HOME at a new directory of the test's, with
// XDG_STATE_HOME and every BERTH_* variable unset (empty), and returns it.
// Workers started later inherit it.
func freshHome(t *testing.T) string {
	t.Helper()
	unsetBerthEnv(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_STATE_HOME", "")
	return home
}

// TestDefaultStateDirLinux: the default is $XDG_STATE_HOME/berth when the
// variable is an absolute path, else ~/.local/state/berth; the reason says
// which, and that it is state, not cache. Without a home there is none,
// and the error names BERTH_STATE_DIR.
func TestDefaultStateDirLinux(t *testing.T) {
	home := freshHome(t)
	xdg := t.TempDir()
	for _, tc := range []struct {
		home, xdg  string
		want, why  string // why: a part of the reason
		wantErrHas string
	}{
		{home: home, want: filepath.Join(home, ".local", "state", "berth"), why: "the default: $XDG_STATE_HOME unset, so ~/.local/state/berth"},
		{home: home, xdg: xdg, want: filepath.Join(xdg, "berth"), why: "the default: $XDG_STATE_HOME/berth"},
		{home: "", xdg: xdg, want: filepath.Join(xdg, "berth"), why: "the default: $XDG_STATE_HOME/berth"},
		{home: home, xdg: "relative/state", want: filepath.Join(home, ".local", "state", "berth"), why: `$XDG_STATE_HOME "relative/state" is relative, which the XDG base directory spec says to ignore`},
		{home: "", wantErrHas: "$HOME is not set"},
		{home: "some/where", wantErrHas: `$HOME "some/where" is not an absolute path`},
	} {
		t.Setenv("HOME", tc.home)
		t.Setenv("XDG_STATE_HOME", tc.xdg)
		dir, why, err := portalloc.DefaultStateDir()
		if tc.wantErrHas != "" {
			if err == nil || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), tc.wantErrHas) || !strings.Contains(err.Error(), "BERTH_STATE_DIR") {
				t.Errorf("HOME=%q XDG_STATE_HOME=%q: DefaultStateDir() = %q, %v; want ErrUnavailable saying %q and naming BERTH_STATE_DIR", tc.home, tc.xdg, dir, err, tc.wantErrHas)
			}
			continue
		}
		if err != nil || dir != tc.want || !strings.Contains(why, tc.why) || !strings.Contains(why, "state, not cache") {
			t.Errorf("HOME=%q XDG_STATE_HOME=%q: DefaultStateDir() = %q, %q, %v; want %q, a reason saying %q and state, not cache", tc.home, tc.xdg, dir, why, err, tc.want, tc.why)
		}
	}
}

// TestNewUsesTheDefaultStateDir: New with no StateDir (and no
// BERTH_STATE_DIR) makes the default directory, 0700, and its store there;
// without a home it refuses, in every mode, naming BERTH_STATE_DIR, and
// makes nothing anywhere: it never falls back to the temporary directory.
func TestNewUsesTheDefaultStateDir(t *testing.T) {
	home := freshHome(t)
	want, _, err := portalloc.DefaultStateDir()
	if err != nil {
		t.Fatal(err)
	}
	if want != filepath.Join(home, ".local", "state", "berth") {
		t.Fatalf("DefaultStateDir() = %s; want the one in the test's HOME %s", want, home)
	}
	a := newOn(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	if got := a.Config().StateDir; got != want {
		t.Errorf("Config().StateDir = %s; want the default %s", got, want)
	}
	if _, err := a.Allocate(context.Background(), portalloc.Request{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(want)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the default state directory: %v, %v; want it made with mode 0700", fi, err)
	}
	if _, err := os.Stat(filepath.Join(want, "berth.db")); err != nil {
		t.Errorf("no store in the default state directory: %v", err)
	}

	t.Setenv("HOME", "")
	for _, mode := range []portalloc.Mode{portalloc.ModeStateStoreWithFallback, portalloc.ModeStateStore, portalloc.ModeMRU} {
		b, err := portalloc.New(context.Background(), portalloc.Config{Mode: mode, IgnoreEnv: true})
		if err == nil {
			_ = b.Close()
		}
		if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "BERTH_STATE_DIR") {
			t.Errorf("New(%s) without a home = %v; want ErrUnavailable naming BERTH_STATE_DIR", mode, err)
		}
	}
}

// TestUnsafeStateDir: a state directory others may write, or a symbolic
// link where berth makes its own file, is refused in every mode with an
// error wrapping ErrUnsafe and ErrUnavailable that says what to fix: the
// MRU file does not serve in its place, and nothing is written there.
func TestUnsafeStateDir(t *testing.T) {
	writable := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(writable, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(writable, 0o777); err != nil {
		t.Fatal(err)
	}
	linked := t.TempDir()
	if err := os.Symlink(filepath.Join(t.TempDir(), "elsewhere.db"), filepath.Join(linked, "berth.db")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, says string
		files           int // what the directory holds before
	}{
		{"world-writable", writable, "chmod go-w", 0},
		{"a symbolic link for the store", linked, "symbolic link", 1},
	} {
		for _, mode := range []portalloc.Mode{portalloc.ModeStateStoreWithFallback, portalloc.ModeStateStore} {
			a, err := portalloc.New(context.Background(), portalloc.Config{Mode: mode, StateDir: tc.dir, Range: allocRange, IgnoreEnv: true})
			if err == nil {
				t.Errorf("New(%s) in a %s state directory = an Allocator (%+v); want an error wrapping ErrUnsafe", mode, tc.name, a.Stats())
				_ = a.Close()
				continue
			}
			if !errors.Is(err, store.ErrUnsafe) || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("New(%s) in a %s state directory = %v; want ErrUnsafe and ErrUnavailable saying %q", mode, tc.name, err, tc.says)
			}
		}
		if entries, _ := os.ReadDir(tc.dir); len(entries) != tc.files {
			t.Errorf("berth wrote into a %s state directory: %v", tc.name, entries)
		}
	}
}

// TestForeignStateDir: a state directory another user owns is refused the
// same way (root only: it gives the directory away).
func TestForeignStateDir(t *testing.T) {
	needRoot(t, "giving a directory to another uid")
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []portalloc.Mode{portalloc.ModeStateStoreWithFallback, portalloc.ModeStateStore} {
		a, err := portalloc.New(context.Background(), portalloc.Config{Mode: mode, StateDir: dir, Range: allocRange, IgnoreEnv: true})
		if err == nil {
			t.Errorf("New(%s) in a directory of uid 54321 = an Allocator; want an error wrapping ErrUnsafe", mode)
			_ = a.Close()
			continue
		}
		if !errors.Is(err, store.ErrUnsafe) || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "54321") {
			t.Errorf("New(%s) in a directory of uid 54321 = %v; want ErrUnsafe and ErrUnavailable naming the owner", mode, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("berth wrote %d files into a directory of uid 54321", len(entries))
	}
}
