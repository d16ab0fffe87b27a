//go:build unix

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUnsafeStateDirFix: a state directory another user owns is refused,
// in the default mode too (no fallback to the MRU file), and berth prints
// what to do about it, once. It needs root, to create that user and chown to it.
func TestUnsafeStateDirFix(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it creates a second user with useradd and gives it the state directory")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("needs useradd to create a second user")
	}
	name := fmt.Sprintf("berth%d", time.Now().UnixNano()%1e8)
	if out, err := exec.Command("useradd", "--no-create-home", name).CombinedOutput(); err != nil {
		t.Skipf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, -1); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BERTH_MODE", "")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"get", "--state-dir", dir}, &stdout, &stderr)
	if code != exitFailure || stdout.Len() != 0 {
		t.Errorf("berth get in a directory of uid %d: exit %d, stdout %q; want exit %d and no port", uid, code, stdout.String(), exitFailure)
	}
	for _, want := range []string{fmt.Sprintf("is owned by uid %d, not by uid 0", uid), "use a state directory of your own"} {
		if n := strings.Count(stderr.String(), want); n != 1 {
			t.Errorf("stderr %q says %q %d times; want once", stderr.String(), want, n)
		}
	}
}
