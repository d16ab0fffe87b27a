package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testproc"

	"github.com/berth-go/berth/internal/testports"
)

// berthEnv returns an environment for berth with a state directory of its
// own and the ports of r. (GORACE: under -race, berth would sleep a second
// as it exits; see TestScripts.)
func berthEnv(tb testing.TB, r testports.Range) []string {
	tb.Helper()
	return append(os.Environ(), "BERTH_STATE_DIR="+tb.TempDir(), "BERTH_PORT_RANGE="+r.String(), "NO_COLOR=1", "GORACE=atexit_sleep_ms=0")
}

// berthProc is a berth process a test started.
type berthProc struct {
	cmd  *exec.Cmd
	out  *testproc.Buffer // its standard output and error
	done chan struct{}    // closed once it has exited and been waited for
}

// startBerth starts berth (on PATH, from TestMain) with args; the test
// SIGKILLs it at its end if it still runs.
func startBerth(tb testing.TB, env []string, args ...string) *berthProc {
	tb.Helper()
	p := &berthProc{cmd: exec.Command("berth", args...), out: &testproc.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// A child left behind would hold the output pipe open, and Wait with it.
	p.cmd.WaitDelay = time.Second
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p
}

// wait waits up to 10s for p to exit and returns its status.
func (p *berthProc) wait(tb testing.TB) *os.ProcessState {
	tb.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState
	case <-time.After(10 * time.Second):
		tb.Fatalf("%s still runs after 10s", p.cmd.Args)
		return nil
	}
}

// readFileWait waits up to 10s for path to exist and returns its content.
func readFileWait(tb testing.TB, path string, ok func(string) bool) string {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && ok(string(b)) {
			return string(b)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %q, %v after 10s", path, b, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunRestartBacklog: berth run --listen --restart on-failure keeps the
// socket while its server exits (on purpose, after each client) and is
// started again; clients that connect while no server runs wait in the
// backlog and are served by the next server, none refused. SIGTERM to
// berth run reaches the server, berth run exits with its status, and the
// port is released at once.
func TestRunRestartBacklog(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	env := berthEnv(t, testports.Range{First: testports.CmdBerth.Last - 9, Last: testports.CmdBerth.Last})
	portFile := filepath.Join(t.TempDir(), "port")
	p := startBerth(t, env, "run", "--listen", "--port", "web", "--restart", "on-failure", "--", "berth-testserver", "serve-once", portFile)
	port, _, _ := strings.Cut(readFileWait(t, portFile, func(s string) bool { return s != "" }), " ")
	seen := map[string]bool{}
	for i := range 3 {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Fatalf("client %d: %v; want it to wait in the backlog\n%s", i, err, p.out)
		}
		connected := monotonic()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		_ = c.Close()
		var pid string
		var started int64
		if _, err2 := fmt.Sscanf(line, "pid %s started %d", &pid, &started); err != nil || err2 != nil {
			t.Fatalf("client %d read %q, %v; want pid N started T\n%s", i, line, err, p.out)
		}
		if seen[pid] {
			t.Errorf("client %d was served by pid %s again; want a new server each time", i, pid)
		}
		seen[pid] = true
		// The server that answered the second and third clients started
		// after they had connected: they waited through the restart.
		if i > 0 && started <= connected {
			t.Errorf("client %d connected at %d, its server started at %d; want it to connect during the restart", i, connected, started)
		}
	}
	// The fourth server runs: SIGTERM to berth run ends it.
	readFileWait(t, portFile, func(s string) bool { _, pid, _ := strings.Cut(s, " "); return !seen[pid] })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st := p.wait(t)
	if st.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("berth run exited with %v after SIGTERM; want 143, its server's status (ended by SIGTERM)\n%s", st, p.out)
	}
	if !strings.Contains(p.out.String(), "exited with status 1; starting it again in 100ms") {
		t.Errorf("berth run said %q; want it to say it starts the server again", p.out)
	}
	ls := exec.Command("berth", "ls")
	ls.Env = env
	if b, err := ls.CombinedOutput(); err != nil || strings.Contains(string(b), port) {
		t.Errorf("berth ls after berth run ended: %s, %v; want port %s released", b, err, port)
	}
}

// TestRunKilledFreesPorts: berth run --listen --restart killed with
// SIGKILL takes its server with it (the kernel's parent-death signal), so
// the port is no longer bound, and its reservation is dead: another
// program can reserve it at once.
func TestRunKilledFreesPorts(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	r := testports.Range{First: testports.CmdBerth.Last - 19, Last: testports.CmdBerth.Last - 10}
	env := berthEnv(t, r)
	portFile := filepath.Join(t.TempDir(), "port")
	p := startBerth(t, env, "run", "--listen", "--port", "web", "--restart", "always", "--", "berth-testserver", "serve-once", portFile)
	port, server, _ := strings.Cut(readFileWait(t, portFile, func(s string) bool { return s != "" }), " ")
	t.Cleanup(func() { // a server left behind when the test fails
		if pid, err := strconv.Atoi(server); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err == nil {
			_ = l.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %s still bound 10s after berth run was killed: %v\n%s", port, err, p.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	res := exec.Command("berth", "reserve", port, "--owner", strconv.Itoa(os.Getpid()))
	res.Env = env
	if b, err := res.CombinedOutput(); err != nil {
		t.Errorf("berth reserve %s after berth run was killed: %v\n%s", port, err, b)
	}
	// The port is this process's now, its lock kept by a keeper until the
	// test binary exits: give it back for the next run of the test.
	rel := exec.Command("berth", "release", port, "--owner", strconv.Itoa(os.Getpid()))
	rel.Env = env
	if b, err := rel.CombinedOutput(); err != nil {
		t.Errorf("berth release %s: %v\n%s", port, err, b)
	}
}

// TestRunWatchRestarts: berth run --watch DIR stops its command (SIGTERM to
// its process group) when a file under DIR changes and starts it again;
// SIGINT to berth run is forwarded and ends both.
func TestRunWatchRestarts(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	r := testports.Range{First: testports.CmdBerth.Last - 29, Last: testports.CmdBerth.Last - 20}
	env := berthEnv(t, r)
	dir, rec := t.TempDir(), filepath.Join(t.TempDir(), "runs")
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startBerth(t, env, "run", "--port", "web", "--watch", dir, "--", "berth-testserver", "record", rec)
	lines := func(n int) func(string) bool { return func(s string) bool { return strings.Count(s, "\n") >= n } }
	first := readFileWait(t, rec, lines(1))
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main // changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	both := strings.Fields(readFileWait(t, rec, lines(2)))
	if len(both) != 2 || both[0] == both[1] || both[0] != strings.TrimSpace(first) {
		t.Errorf("runs recorded %q; want two, of two processes\n%s", both, p.out)
	}
	oldPID, _ := strconv.Atoi(both[0])
	if err := syscall.Kill(oldPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("first run (pid %d) still runs after the restart: %v", oldPID, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	st := p.wait(t)
	if st.ExitCode() != 0 {
		t.Errorf("berth run exited with %v after SIGINT; want 0, its command's (which ends on SIGINT)\n%s", st, p.out)
	}
	if !strings.Contains(p.out.String(), "a watched path changed") {
		t.Errorf("berth run said %q; want it to say a watched path changed", p.out)
	}
}
