package portlock_test

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A test that needs another process runs this test binary again in a role:
// the role's name in envRole, its arguments in envArgs.
const (
	envRole = "PORTLOCK_TEST_ROLE"
	envArgs = "PORTLOCK_TEST_ARGS"
)

var roles = map[string]func(args []string) int{}

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		fn := roles[role]
		if fn == nil {
			fmt.Fprintf(os.Stderr, "no role %q\n", role)
			os.Exit(2)
		}
		os.Exit(fn(strings.Fields(os.Getenv(envArgs))))
	}
	os.Exit(m.Run())
}

// worker is a running process of a role. It talks in lines: what it
// prints, the test reads with next.
type worker struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func start(tb testing.TB, role string, args ...string) *worker {
	tb.Helper()
	return startWith(tb, nil, role, args...)
}

// startWith starts a worker that inherits files from descriptor 3 up.
func startWith(tb testing.TB, files []*os.File, role string, args ...string) *worker {
	tb.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.ExtraFiles = files
	cmd.Env = append(os.Environ(), envRole+"="+role, envArgs+"="+strings.Join(args, " "))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	w := &worker{cmd: cmd, in: in, lines: make(chan string, 1024)}
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	tb.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	})
	return w
}

// next returns the worker's next line, failing the test after a while.
func (w *worker) next(tb testing.TB) string {
	tb.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			tb.Fatalf("worker %d ended", w.cmd.Process.Pid)
		}
		return l
	case <-time.After(waitLimit):
		tb.Fatalf("worker %d said nothing for %v", w.cmd.Process.Pid, waitLimit)
		return ""
	}
}

// waitLimit bounds every wait of a test for another process: generous,
// since a loaded machine can be slow to start one.
const waitLimit = 60 * time.Second

// eventually polls cond until it holds or waitLimit passes.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not after %v", what, waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
