//go:build unix

package porttest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/porttest"
	"github.com/berth-go/berth/portalloc/statedir"
)

// TestSandboxWorker takes a port as a test in a sandbox does, and prints
// it: it runs only as a worker of TestNoHome.
func TestSandboxWorker(t *testing.T) {
	if testproc.Role() != "sandbox" {
		t.Skip("runs only as a worker process of TestNoHome")
	}
	fmt.Println("port", porttest.Port(t))
}

// sandboxed runs TestSandboxWorker as a test of a sandbox would run: no
// BERTH_STATE_DIR, no XDG variables, HOME as given ("" unsets it), and
// TMPDIR tmp. It returns the worker's output and whether it passed.
func sandboxed(tb testing.TB, home, tmp string) (string, bool) {
	tb.Helper()
	cmd := testproc.Command(tb, "sandbox", "-test.run=^TestSandboxWorker$", "-test.v")
	var env []string
	for _, kv := range cmd.Env {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "TMPDIR" || k == portalloc.EnvStateDir || strings.HasPrefix(k, "XDG_") {
			continue
		}
		env = append(env, kv)
	}
	if home != "" {
		env = append(env, "HOME="+home)
	}
	cmd.Env = append(env, "TMPDIR="+tmp)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// TestNoHome: porttest works where HOME is unset or cannot be written, as
// in Nix and Bazel sandboxes and minimal CI containers, with its store in
// a directory of the user's under the temporary directory; and it refuses
// such a directory that another user made.
func TestNoHome(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want := "berth-" + strconv.Itoa(os.Getuid())
	for _, tc := range []struct{ name, home string }{
		{"HOME unset", ""},
		{"HOME under a file", filepath.Join(file, "home")}, // cannot be created, even by root
	} {
		tmp := t.TempDir()
		out, ok := sandboxed(t, tc.home, tmp)
		if !ok || !strings.Contains(out, "port ") {
			t.Errorf("%s: porttest.Port failed:\n%s", tc.name, out)
			continue
		}
		dir := filepath.Join(tmp, want)
		if !strings.Contains(out, "porttest: using "+dir+" as the state directory") {
			t.Errorf("%s: the worker did not say where its store is:\n%s", tc.name, out)
		}
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm() != 0o700 || !fi.IsDir() {
			t.Errorf("%s: %s = %v, %v; want a directory of mode 0700", tc.name, dir, fi, err)
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, statedir.DatabaseFile)); err != nil {
			t.Errorf("%s: no store in %s: %v", tc.name, dir, err)
		}
	}

	// A berth-<uid> of another user in the temporary directory is refused.
	if os.Geteuid() != 0 {
		t.Skip("making a directory of another user needs root")
	}
	tmp := t.TempDir()
	dir := filepath.Join(tmp, want)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Skipf("chown: %v", err)
	}
	out, ok := sandboxed(t, "", tmp)
	if ok || !strings.Contains(out, dir+" is owned by uid 65534") {
		t.Errorf("a %s of another user: worker passed %v; want it to fail saying who owns it:\n%s", want, ok, out)
	}
	if _, err := os.Stat(filepath.Join(dir, statedir.DatabaseFile)); err == nil {
		t.Errorf("a store was made in another user's directory %s", dir)
	}
}
