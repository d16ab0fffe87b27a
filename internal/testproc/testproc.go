// Package testproc re-runs a test binary as a worker process in a named
// role, for tests of what berth does across processes: two processes
// reserving one port, a holder SIGKILLed, a lock held elsewhere.
//
// A test file registers its roles (from init, or in TestMain before
// MaybeRun), TestMain calls MaybeRun first thing, and a test starts a
// worker with Command:
//
//	func init() { testproc.Register("hold", hold) }
//
//	func TestMain(m *testing.M) {
//		testproc.MaybeRun() // in a worker: runs its role and exits
//		goleak.VerifyTestMain(m)
//	}
//
//	func TestHeld(t *testing.T) {
//		cmd := testproc.Command(t, "hold")
//		...
//	}
//
// A worker learns its role from the environment variable EnvRole and runs
// before any test flag is parsed; it inherits its parent's environment, so
// the parent passes it whatever else it needs there.
//
// The package imports only the standard library: it is a leaf below
// everything it serves.
package testproc

import (
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

// EnvRole is the environment variable that names the role of a worker. A
// worker that starts a worker of its own without a testing.TB (say, a
// child it hands a port to) sets it too: EnvRole+"="+role.
const EnvRole = "BERTH_TESTPROC_ROLE"

// mu guards roles: Register may run from the init functions of several
// files and from TestMain.
var (
	mu    sync.Mutex
	roles = map[string]func() int{}
)

// Register makes fn the role name: a worker started in that role runs fn
// and exits with the code it returns. It panics when name is empty or
// already registered, which are mistakes in the test code.
func Register(name string, fn func() int) {
	mu.Lock()
	defer mu.Unlock()
	if name == "" || fn == nil {
		panic("testproc: Register needs a name and a function")
	}
	if _, dup := roles[name]; dup {
		panic("testproc: role " + name + " registered twice")
	}
	roles[name] = fn
}

// Role returns the role this process runs in, or "" in the test process
// itself.
func Role() string { return os.Getenv(EnvRole) }

// MaybeRun runs the role of this process and exits with its code, when
// the process is a worker; in the test process itself it returns at once.
// A worker whose role no one registered exits 2, naming the roles there
// are. TestMain calls it before anything else, goleak and port locks
// included: those are the test process's business.
func MaybeRun() {
	role := Role()
	if role == "" {
		return
	}
	mu.Lock()
	fn, ok := roles[role]
	mu.Unlock()
	if !ok {
		fmt.Fprintf(os.Stderr, "testproc: %s=%q: no such role; registered: %s\n", EnvRole, role, strings.Join(names(), ", "))
		os.Exit(2)
	}
	os.Exit(fn())
}

func names() []string {
	mu.Lock()
	defer mu.Unlock()
	return slices.Sorted(maps.Keys(roles))
}

// Command returns a command that runs this test binary as a worker in the
// given role, with args after the flags -test.run=^$ -test.bench=^$ (so a
// worker that does not exit in MaybeRun runs no test; a role that calls
// m.Run can pass a -test.run of its own, which wins) and EnvRole set in an
// environment inherited from this process: add to cmd.Env, do not replace
// it. Stdin, Stdout and Stderr are left unset, as exec.Command leaves them.
//
// It fails tb at once when role is not registered. When tb ends, after the
// cleanups registered later (which may close the worker's stdin and wait
// for it to finish on its own), Command's cleanup SIGKILLs the worker if
// it is still running; waiting for it stays with the test, since an
// exec.Cmd allows one Wait.
func Command(tb testing.TB, role string, args ...string) *exec.Cmd {
	tb.Helper()
	mu.Lock()
	_, ok := roles[role]
	mu.Unlock()
	if !ok {
		tb.Fatalf("testproc: no role %q; registered: %s", role, strings.Join(names(), ", "))
	}
	self, err := os.Executable()
	if err != nil {
		tb.Fatalf("testproc: find the test binary: %v", err)
	}
	cmd := exec.Command(self, append([]string{"-test.run=^$", "-test.bench=^$"}, args...)...)
	cmd.Env = append(os.Environ(), EnvRole+"="+role)
	tb.Cleanup(func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill() // os.ErrProcessDone once it has been waited for
		}
	})
	return cmd
}

// Start starts cmd, a worker from Command (possibly rewrapped, say to run in
// a network namespace), with the test's stderr as its own, and returns its
// stdin and stdout. It fails tb when cmd cannot start. Stopping the worker
// is the caller's: most close its stdin.
func Start(tb testing.TB, cmd *exec.Cmd) (stdin io.WriteCloser, stdout io.ReadCloser) {
	tb.Helper()
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err = cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start worker %s: %v", cmd.Path, err)
	}
	return stdin, stdout
}
