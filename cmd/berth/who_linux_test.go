package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testports"
)

// berthOut runs berth with args and returns its output and error.
func berthOut(env []string, args ...string) (string, error) {
	cmd := exec.Command("berth", args...)
	cmd.Env = env
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// me returns the name of the user the test runs as.
func me(tb testing.TB) string {
	tb.Helper()
	u, err := user.Current()
	if err != nil {
		tb.Fatal(err)
	}
	return u.Username
}

// oneSpace returns s with each run of spaces as one, so that a test
// need not know the widths of a table's columns.
func oneSpace(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// TestWhoOutsideListener: berth who finds a plain Go program listening on
// a port outside berth, with its pid, user and command line, in text and
// JSON; --kill stops it and says so.
func TestWhoOutsideListener(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	port := int(testports.CmdBerth.Last - 30)
	env := berthEnv(t, testports.Range{First: uint16(port) - 9, Last: uint16(port) - 1})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	srv := exec.Command("berth-testserver", "listen", addr)
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	t.Cleanup(func() { _ = srv.Process.Kill(); <-done })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("berth-testserver listen %s said %q, %v", addr, line, err)
	}
	go func() { done <- srv.Wait() }()
	pid := srv.Process.Pid

	out, err := berthOut(env, "who", strconv.Itoa(port))
	out = oneSpace(out)
	want := fmt.Sprintf("bound tcp %s LISTEN pid %d %s berth-testserve berth-testserver listen %s", addr, pid, me(t), addr)
	if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "no reservation by berth") {
		t.Errorf("berth who %d = %q, %v; want a line with %q", port, out, err, want)
	}

	out, err = berthOut(env, "who", "--json", strconv.Itoa(port))
	var rep []whoJSON
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || len(rep) != 1 || len(rep[0].Sockets) != 1 || len(rep[0].Sockets[0].Processes) != 1 {
		t.Fatalf("berth who --json %d = %q, %v; want one socket of one process", port, out, err)
	}
	if p := rep[0].Sockets[0].Processes[0]; p.PID != pid || strings.Join(p.Args, " ") != "berth-testserver listen "+addr {
		t.Errorf("berth who --json: process %+v; want pid %d, args berth-testserver listen %s", p, pid, addr)
	}

	out, err = berthOut(env, "who", "--kill", strconv.Itoa(port))
	if want := fmt.Sprintf("sent SIGTERM to pid %d (berth-testserve)", pid); err != nil || !strings.Contains(out, want) {
		t.Errorf("berth who --kill %d = %q, %v; want %q", port, out, err, want)
	}
	if err := <-done; err != nil {
		t.Errorf("berth-testserver ended with %v; want 0 (it exits on SIGTERM)", err)
	}
	done <- nil // for the cleanup
	if out, _ := berthOut(env, "who", strconv.Itoa(port)); !strings.Contains(out, "no socket is bound to it") {
		t.Errorf("berth who %d after --kill = %q; want nothing bound", port, out)
	}
}

// TestWhoRunListen: berth who shows a port of berth run --listen --restart
// as reserved by berth run, alive, locked by berth run, and bound by both
// berth run (which keeps the socket) and its server; ls --bound marks it
// bound. berth run killed with SIGKILL takes the server with it.
func TestWhoRunListen(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	env := berthEnv(t, testports.Range{First: testports.CmdBerth.Last - 49, Last: testports.CmdBerth.Last - 40})
	portFile := filepath.Join(t.TempDir(), "port")
	p := startBerth(t, env, "run", "--listen", "--port", "web", "--restart", "always", "--", "berth-testserver", "serve-once", portFile)
	port, server, _ := strings.Cut(readFileWait(t, portFile, func(s string) bool { return s != "" }), " ")
	out, err := berthOut(env, "who", port)
	out = oneSpace(out)
	for _, want := range []string{
		fmt.Sprintf("reserved tcp 127.0.0.1 label run/port/web pid %d (berth) alive", p.cmd.Process.Pid),
		fmt.Sprintf("locked tcp 127.0.0.1 held pid %d %s berth berth run --listen", p.cmd.Process.Pid, me(t)),
		fmt.Sprintf("bound tcp 127.0.0.1:%s LISTEN pid %d %s berth berth run --listen", port, p.cmd.Process.Pid, me(t)),
		fmt.Sprintf("bound tcp 127.0.0.1:%s LISTEN pid %s %s berth-testserve berth-testserver serve-once %s", port, server, me(t), portFile),
	} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("berth who %s = %q, %v; want a line with %q", port, out, err, want)
		}
	}
	// (--label: berth ls lists every lock of the host too.)
	out, err = berthOut(env, "ls", "--bound", "--label", "run/port/web")
	if err != nil || !strings.Contains(out, "run/port/web") || !strings.HasSuffix(oneSpace(strings.TrimSpace(out)), " yes yes") {
		t.Errorf("berth ls --bound = %q, %v; want run/port/web alive and bound", out, err)
	}

	// Killed, berth run takes its server with it: the parent-death signal
	// it gives the child outlives the exec that places the socket.
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	pid, err := strconv.Atoi(server)
	if err != nil {
		t.Fatalf("server pid %q: %v", server, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("server pid %d still ran 10s after berth run was killed with SIGKILL\n%s", pid, p.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
