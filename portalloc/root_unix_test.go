//go:build unix

package portalloc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// otherUser creates a real user with a home of its own for the test (root
// only; the test is skipped otherwise) and deletes it, home included, when
// the test ends.
func otherUser(t *testing.T) *user.User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it creates a second user with useradd, and checks what root does in that user's home")
	}
	useradd, err := exec.LookPath("useradd")
	if err != nil {
		t.Skip("needs useradd to create a second user")
	}
	name := fmt.Sprintf("berth%d", time.Now().UnixNano()%1e8)
	if out, err := exec.Command(useradd, "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Skipf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
			t.Errorf("userdel --remove %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
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

// TestRootKeepsOutOfAnotherUsersHome: root with HOME set to another user's
// home (sudo keeps it) puts its state in its own cache directory, from the
// password database, and creates nothing in that user's home.
func TestRootKeepsOutOfAnotherUsersHome(t *testing.T) {
	alice := otherUser(t)
	t.Setenv("HOME", alice.HomeDir)
	t.Setenv("XDG_CACHE_HOME", "") // empty: os.UserCacheDir uses $HOME/.cache
	before := tree(t, alice.HomeDir)

	// The real password database: root's own cache directory.
	root, err := user.LookupId("0")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DefaultStateDir(); err != nil || got != filepath.Join(root.HomeDir, ".cache", "berth") {
		t.Errorf("DefaultStateDir() with HOME=%s = %q, %v; want root's own %s", alice.HomeDir, got, err, filepath.Join(root.HomeDir, ".cache", "berth"))
	}

	// An Allocator with the default state directory opens its store there.
	// Root's home is a directory of the test's here, so the test leaves
	// the machine's own store alone.
	rootHome := t.TempDir()
	defer swap(&lookupRoot, func() (*user.User, error) { return &user.User{Uid: "0", Username: "root", HomeDir: rootHome}, nil })()
	var logged []string
	a, err := New(context.Background(), Config{Mode: ModeStateStore, Logger: recordLogger(&logged)})
	if err != nil {
		t.Fatalf("New with HOME=%s as root = %v; want root's own state directory", alice.HomeDir, err)
	}
	defer a.Close()
	want := filepath.Join(rootHome, ".cache", "berth")
	if got := a.Config().StateDir; got != want {
		t.Errorf("StateDir = %s; want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(want, DatabaseFile)); err != nil {
		t.Errorf("no state store in root's own directory: %v", err)
	}
	if len(logged) == 0 {
		t.Errorf("New logged nothing; want it to say it used root's own state directory")
	}
	// Without root's home in the password database, New refuses.
	defer swap(&lookupRoot, func() (*user.User, error) { return nil, user.UnknownUserIdError(0) })()
	if _, err := New(context.Background(), Config{}); !errors.Is(err, ErrUnsafe) {
		t.Errorf("New without root's home = %v; want an error wrapping ErrUnsafe", err)
	}

	after := tree(t, alice.HomeDir)
	for p, uid := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("root created %s (owner uid %d) in %s's home", p, uid, alice.Username)
		}
	}
}

// TestUnsafeStateDirIsNoFallback: a state directory another user owns is
// refused with ErrUnsafe in the fallback mode too: the MRU file does not
// serve in its place.
func TestUnsafeStateDirIsNoFallback(t *testing.T) {
	alice := otherUser(t)
	uid, _ := strconv.Atoi(alice.Uid)
	gid, _ := strconv.Atoi(alice.Gid)
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{ModeStateStoreWithFallback, ModeStateStore} {
		a, err := New(context.Background(), Config{Mode: mode, StateDir: dir})
		if err == nil {
			t.Errorf("New(%s) in a directory of uid %d = an Allocator on %s; want an error wrapping ErrUnsafe", mode, uid, a.Backend())
			_ = a.Close()
			continue
		}
		if !errors.Is(err, ErrUnsafe) || !errors.Is(err, ErrStoreUnavailable) {
			t.Errorf("New(%s) in a directory of uid %d = %v; want ErrUnsafe and ErrStoreUnavailable", mode, uid, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("berth wrote %d files into a directory of uid %d", len(entries), uid)
	}
}

// recordLogger logs into *lines.
func recordLogger(lines *[]string) logr.Logger {
	var mu sync.Mutex
	return funcr.New(func(prefix, args string) { mu.Lock(); *lines = append(*lines, args); mu.Unlock() }, funcr.Options{})
}

func swap[T any](v *T, to T) (restore func()) {
	old := *v
	*v = to
	return func() { *v = old }
}
