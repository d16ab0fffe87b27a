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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/statestore"
)

// otherUser creates a real user with a home of its own for the test (root
// only; the test is skipped otherwise) and deletes it, home included, when
// the test ends.
func otherUser(tb testing.TB) *user.User {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: it creates a second user with useradd, and checks what root does in that user's home")
	}
	useradd, err := exec.LookPath("useradd")
	if err != nil {
		tb.Skip("needs useradd to create a second user")
	}
	name := fmt.Sprintf("berth%d", time.Now().UnixNano()%1e8)
	if out, err := exec.Command(useradd, "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		tb.Skipf("useradd %s: %v: %s", name, err, out)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
			tb.Errorf("userdel --remove %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// tree lists everything under dir, with owners.
func tree(tb testing.TB, dir string) map[string]uint32 {
	tb.Helper()
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
		tb.Fatal(err)
	}
	return out
}

// TestRootKeepsOutOfAnotherUsersHome: root with HOME set to another user's
// home (sudo keeps it) puts its state in its own cache directory, from the
// password database, and creates nothing in that user's home.
func TestRootKeepsOutOfAnotherUsersHome(t *testing.T) {
	alice := otherUser(t)
	t.Setenv("HOME", alice.HomeDir)
	t.Setenv("XDG_STATE_HOME", "") // empty: the default is $HOME/.local/state/berth
	t.Setenv("XDG_CACHE_HOME", "") // and the previous default $HOME/.cache/berth
	before := tree(t, alice.HomeDir)

	// The real password database: root's own state directory.
	root, err := user.LookupId("0")
	if err != nil {
		t.Fatal(err)
	}
	rootOwn := filepath.Join(root.HomeDir, ".local", "state", "berth")
	if got, err := defaultStateDir(); err != nil || got != rootOwn {
		t.Errorf("defaultStateDir() with HOME=%s = %q, %v; want root's own %s", alice.HomeDir, got, err, rootOwn)
	}
	if _, why, err := defaultStateDirReason(); err != nil || !strings.Contains(why, "root's own ~root/.local/state/berth") {
		t.Errorf("defaultStateDirReason() with HOME=%s = %q, %v; want it to say root uses its own", alice.HomeDir, why, err)
	}
	// XDG_STATE_HOME in that user's home, as sudo keeps it, is not taken
	// either.
	t.Setenv("XDG_STATE_HOME", filepath.Join(alice.HomeDir, ".state"))
	if got, err := defaultStateDir(); err != nil || got != rootOwn {
		t.Errorf("defaultStateDir() with XDG_STATE_HOME=%s = %q, %v; want root's own %s", filepath.Join(alice.HomeDir, ".state"), got, err, rootOwn)
	}
	t.Setenv("XDG_STATE_HOME", "")

	// An Allocator with the default state directory opens its store there.
	// Root's home is a directory of the test's here, so the test leaves
	// the machine's own store alone.
	rootHome := t.TempDir()
	defer swap(&lookupRoot, func() (*user.User, error) { return &user.User{Uid: "0", Username: "root", HomeDir: rootHome}, nil })()
	// Root's own store at the previous default, ~root/.cache/berth,
	// moves to root's own state directory; the one in the other user's
	// home would not be root's to take.
	oldOwn := filepath.Join(rootHome, ".cache", "berth", databaseFile)
	s, err := statestore.Open(context.Background(), oldOwn, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remember(context.Background(), "api", TCP, 24999); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var logged []string
	a, err := New(context.Background(), Config{Mode: ModeStateStore, Logger: recordLogger(&logged)})
	if err != nil {
		t.Fatalf("New with HOME=%s as root = %v; want root's own state directory", alice.HomeDir, err)
	}
	defer a.Close()
	want := filepath.Join(rootHome, ".local", "state", "berth")
	if got := a.Config().StateDir; got != want {
		t.Errorf("StateDir = %s; want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(want, databaseFile)); err != nil {
		t.Errorf("no state store in root's own directory: %v", err)
	}
	if m, ok, err := statestore.ReadMoved(oldOwn); err != nil || !ok || m.To != filepath.Join(want, databaseFile) {
		t.Errorf("root's store at %s: moved %v to %q (%v); want it taken over into %s", oldOwn, ok, m.To, err, want)
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

// TestTakeOverRefusesForeignOldDir: a user whose old default belongs to
// another user (root, say, from an earlier sudo) gets an error wrapping
// ErrUnsafe from New, nothing moves, and no store is made at the new
// default. The test runs as root and pretends not to be, so that the root
// rule does not send it to root's own directories.
func TestTakeOverRefusesForeignOldDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another uid")
	}
	defer swap(&geteuid, func() int { return 1000 })()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "")
	oldDir := filepath.Join(home, ".cache", "berth")
	s, err := statestore.Open(context.Background(), filepath.Join(oldDir, databaseFile), statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remember(context.Background(), "api", TCP, 24998); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(oldDir, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	_, err = New(context.Background(), Config{Mode: ModeStateStoreWithFallback})
	if !errors.Is(err, ErrUnsafe) || !errors.Is(err, ErrStoreUnavailable) || !strings.Contains(err.Error(), "owned by uid 54321") || !strings.Contains(err.Error(), "nothing was moved") {
		t.Errorf("New with an old default of uid 54321 = %v; want ErrUnsafe naming the owner and saying nothing was moved", err)
	}
	if _, err := os.Stat(filepath.Join(home, ".local", "state", "berth", databaseFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a store was made at the new default after a refused take-over (%v)", err)
	}
	if fi, err := os.Stat(filepath.Join(oldDir, databaseFile)); err != nil || fi.Size() == 0 {
		t.Errorf("the old store after a refused take-over: %v; want it as it was", err)
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
