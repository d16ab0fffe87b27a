//go:build linux

package statestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// otherUser returns the uid and gid of an unprivileged user that is not this
// process's: one the test creates with useradd (removed at the end), or,
// where useradd is missing, a uid no account uses. It skips unless root,
// which alone can give files away.
func otherUser(tb testing.TB) (uid, gid int) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to create a second user and give it files; run the tests as root to include it")
	}
	name := fmt.Sprintf("berth%d", os.Getpid()%100000)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		tb.Logf("useradd %s: %v: %s; using uid 54321 without an account", name, err, out)
		return 54321, 54321
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			tb.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		tb.Fatal(err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// TestUnsafeStateRefused: every way another user could control what berth
// reads or writes in a state directory is refused with ErrUnsafe, and the
// file the trick aims at stays as it was.
func TestUnsafeStateRefused(t *testing.T) {
	uid, gid := otherUser(t)
	ctx := context.Background()
	chown := func(t *testing.T, path string) {
		t.Helper()
		if err := os.Lchown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		set    func(t *testing.T, dir string) (target string) // target: a file that must not change or appear
		reason string
	}{
		{"directory of another user", func(t *testing.T, dir string) string {
			t.Helper()
			chown(t, dir)
			return filepath.Join(dir, "berth.db")
		}, "owned by uid"},
		{"directory others may write", func(t *testing.T, dir string) string {
			t.Helper()
			_ = os.Chmod(dir, 0o777)
			return filepath.Join(dir, "berth.db")
		}, "may be written"},
		{"directory its group may write", func(t *testing.T, dir string) string {
			t.Helper()
			_ = os.Chmod(dir, 0o770)
			return filepath.Join(dir, "berth.db")
		}, "may be written"},
		{"database swapped in by another user", func(t *testing.T, dir string) string {
			t.Helper()
			other := filepath.Join(t.TempDir(), "theirs.db")
			if err := openAt(t, other).Close(); err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(other)
			db := filepath.Join(dir, "berth.db")
			if err := os.WriteFile(db, data, 0o600); err != nil {
				t.Fatal(err)
			}
			chown(t, db)
			return db
		}, "owned by uid"},
		{"database link to a root-owned empty file", func(t *testing.T, dir string) string {
			t.Helper()
			target := filepath.Join(t.TempDir(), "empty")
			if err := os.WriteFile(target, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(dir, "berth.db")); err != nil {
				t.Fatal(err)
			}
			return target
		}, "symbolic link"},
		{"lock file link to elsewhere", func(t *testing.T, dir string) string {
			t.Helper()
			target := filepath.Join(t.TempDir(), "planted")
			if err := os.Symlink(target, filepath.Join(dir, "berth.db.lock")); err != nil {
				t.Fatal(err)
			}
			return target
		}, "symbolic link"},
		{"migration lock link to elsewhere", func(t *testing.T, dir string) string {
			t.Helper()
			target := filepath.Join(t.TempDir(), "planted")
			if err := os.Symlink(target, filepath.Join(dir, "berth.db.migrate.lock")); err != nil {
				t.Fatal(err)
			}
			return target
		}, "symbolic link"},
		{"WAL link to elsewhere", func(t *testing.T, dir string) string {
			t.Helper()
			target := filepath.Join(t.TempDir(), "planted")
			if err := os.Symlink(target, filepath.Join(dir, "berth.db-wal")); err != nil {
				t.Fatal(err)
			}
			return target
		}, "symbolic link"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			target := tt.set(t, dir)
			before, beforeErr := os.ReadFile(target)
			s, err := statestore.Open(ctx, filepath.Join(dir, "berth.db"), statestore.Options{SweepInterval: -1})
			if err == nil {
				_ = s.Close()
				t.Fatalf("Open succeeded; want ErrUnsafe")
			}
			if !errors.Is(err, store.ErrUnsafe) || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("Open = %v; want ErrUnsafe saying %q", err, tt.reason)
			}
			after, afterErr := os.ReadFile(target)
			if string(before) != string(after) || (beforeErr == nil) != (afterErr == nil) {
				t.Errorf("%s changed: %d bytes (%v) before, %d bytes (%v) after", target, len(before), beforeErr, len(after), afterErr)
			}
		})
	}
}
