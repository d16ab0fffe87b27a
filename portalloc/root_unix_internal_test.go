//go:build unix

package portalloc

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/store"
)

// logLines returns a Logger that records each line into *lines.
func logLines(lines *[]string) logr.Logger {
	var mu sync.Mutex
	return funcr.New(func(_, args string) { mu.Lock(); *lines = append(*lines, args); mu.Unlock() }, funcr.Options{})
}

// otherHome makes a home directory of another user, uid 54321, for the
// test (root only; the test is skipped otherwise).
func otherHome(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it checks what root does in another user's home")
	}
	home := filepath.Join(t.TempDir(), "alice")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	return home
}

// tree lists everything under dir, with owners.
func tree(t *testing.T, dir string) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		out[p] = fi.Sys().(*syscall.Stat_t).Uid
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func swap[T any](v *T, to T) (restore func()) {
	old := *v
	*v = to
	return func() { *v = old }
}

// TestRootKeepsOutOfAnotherUsersHome: root with HOME set to another user's
// home (sudo keeps it) puts its state in its own state directory, from the
// password database, says so, and creates nothing in that user's home.
// Without root's home, or with root's own in another user's tree too, New
// refuses with ErrUnsafe.
func TestRootKeepsOutOfAnotherUsersHome(t *testing.T) {
	alice := otherHome(t)
	t.Setenv("HOME", alice)
	t.Setenv("XDG_STATE_HOME", "") // empty: the default is $HOME/.local/state/berth
	t.Setenv("BERTH_STATE_DIR", "")
	before := tree(t, alice)

	rootHome := t.TempDir()
	defer swap(&lookupRoot, func() (*user.User, error) { return &user.User{Uid: "0", Username: "root", HomeDir: rootHome}, nil })()
	rootOwn := filepath.Join(rootHome, ".local", "state", "berth")
	if got, why, err := DefaultStateDir(); err != nil || got != rootOwn || !strings.Contains(why, "root's own ~root/.local/state/berth") {
		t.Errorf("DefaultStateDir() with HOME=%s = %q, %q, %v; want root's own %s, saying so", alice, got, why, err, rootOwn)
	}
	// XDG_STATE_HOME in that user's home, as sudo keeps it, is not taken
	// either.
	t.Setenv("XDG_STATE_HOME", filepath.Join(alice, ".state"))
	if got, _, err := DefaultStateDir(); err != nil || got != rootOwn {
		t.Errorf("DefaultStateDir() with XDG_STATE_HOME=%s = %q, %v; want root's own %s", filepath.Join(alice, ".state"), got, err, rootOwn)
	}
	t.Setenv("XDG_STATE_HOME", "")

	var logged []string
	a, err := New(context.Background(), Config{Mode: ModeStateStore, Logger: logLines(&logged), Range: store.Range{First: 29000, Last: 29099}})
	if err != nil {
		t.Fatalf("New with HOME=%s as root = %v; want root's own state directory", alice, err)
	}
	if got := a.Config().StateDir; got != rootOwn {
		t.Errorf("StateDir = %s; want %s", got, rootOwn)
	}
	if _, err := a.Allocate(context.Background(), Request{}); err != nil {
		t.Error(err)
	}
	if err := a.Close(); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(rootOwn, databaseFile)); err != nil {
		t.Errorf("no state store in root's own directory: %v", err)
	}
	if len(logged) == 0 || !strings.Contains(strings.Join(logged, "\n"), "using root's own state directory") {
		t.Errorf("New logged %q; want it to say it used root's own state directory", logged)
	}

	// Without root's home in the password database, New refuses.
	restore := swap(&lookupRoot, func() (*user.User, error) { return nil, user.UnknownUserIdError(0) })
	if _, err := New(context.Background(), Config{IgnoreEnv: true}); !errors.Is(err, store.ErrUnsafe) {
		t.Errorf("New without root's home = %v; want an error wrapping ErrUnsafe", err)
	}
	restore()
	// Nor does root take its own when that is in another user's tree too.
	defer swap(&lookupRoot, func() (*user.User, error) {
		return &user.User{Uid: "0", Username: "root", HomeDir: filepath.Join(alice, "root")}, nil
	})()
	if _, err := New(context.Background(), Config{IgnoreEnv: true}); !errors.Is(err, store.ErrUnsafe) || !strings.Contains(err.Error(), "uid 54321") {
		t.Errorf("New with root's own home in uid 54321's = %v; want ErrUnsafe naming the uid", err)
	}

	after := tree(t, alice)
	for p, uid := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("root created %s (owner uid %d) in the other user's home", p, uid)
		}
	}
}

// TestNotRootTakesItsHome: a process that is not root uses the default of
// its HOME, whoever owns it.
func TestNotRootTakesItsHome(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_STATE_HOME", "")
	defer swap(&geteuid, func() int { return 1000 })()
	if got, why, err := DefaultStateDir(); err != nil || got != filepath.Join(home, ".local", "state", "berth") || strings.Contains(why, "root") {
		t.Errorf("DefaultStateDir() of uid 1000 = %q, %q, %v; want its own HOME's", got, why, err)
	}
}
