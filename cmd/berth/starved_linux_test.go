package main

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testports"
)

func init() { commands["berth-flocker"] = func() { os.Exit(flocker(os.Args[1:])) } }

// flocker takes the store's write lock (the flock of berth.db.lock in the
// directory args[0], which every write of the store takes first), prints
// "ready" and holds it until its standard input closes: stopped with
// SIGSTOP, it is a lock holder frozen in the middle of a write.
func flocker(args []string) int {
	f, err := os.OpenFile(filepath.Join(args[0], "berth.db.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 1
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return 1
	}
	os.Stdout.WriteString("ready\n")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestBoundedWhenStarved: with the store's write lock held by a frozen
// process and every core kept busy (two runnable processes a core: busy
// loops of its own, less what the machine runs already), every berth
// command that writes to the store returns within its --timeout plus a
// second, saying the store is busy, round after round.
func TestBoundedWhenStarved(t *testing.T) {
	if testing.Short() {
		t.Skip("keeps every core busy")
	}
	testports.Hold(t, testports.CmdBerth)
	r := testports.Range{First: testports.CmdBerth.Last - 49, Last: testports.CmdBerth.Last - 40}
	env := append(berthEnv(t, r), "BERTH_MODE=statestore")
	var dir string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "BERTH_STATE_DIR="); ok {
			dir = v
		}
	}
	// The store exists, with a port of a shell that has exited, before
	// its lock is taken.
	seed := exec.Command("berth", "get", "--label", "seed")
	seed.Env = env
	out, err := seed.Output()
	if err != nil {
		t.Fatalf("berth get: %v", err)
	}
	port := strings.TrimSpace(string(out))

	lk := exec.Command("berth-flocker", dir)
	lk.Env = env
	stdin, err := lk.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := lk.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = lk.Process.Signal(syscall.SIGCONT)
		_ = stdin.Close()
		_ = lk.Wait()
	})
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("berth-flocker said %q; want ready", line)
	}
	if err := lk.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Two busy loops a core, less what runs already: under a loaded
	// machine (the suite run beside busy loops, or beside other test
	// binaries), the commands meet the load the bound is for, not twice
	// it.
	loops := 2*runtime.NumCPU() - runnable(t)
	t.Logf("%d busy loops beside what runs already", max(loops, 0))
	for range loops {
		busy := exec.Command("sh", "-c", "while :; do :; done")
		if err := busy.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	}

	const timeout = 2 * time.Second
	commands := [][]string{
		{"get", "--label", "starved"},
		{"reserve", strconv.Itoa(int(r.Last))},
		{"release", port, "--owner", strconv.Itoa(os.Getpid())},
		{"reap"},
	}
	for round := range 3 {
		for _, args := range commands {
			// The program's start and exit, slow on a starved CPU, are
			// not the command's: ownTime takes them off.
			out, took, start, err := ownTime(env, append(args, "--timeout", timeout.String())...)
			if took > timeout+time.Second {
				t.Errorf("round %d: berth %s took %v with the store's lock frozen and every core busy, beyond the %v the program takes to start and exit; want at most %v (output %q)",
					round, strings.Join(args, " "), took, start, timeout+time.Second, out)
			}
			if err == nil && args[0] != "reap" && args[0] != "release" {
				t.Errorf("round %d: berth %s succeeded with the store's lock frozen: %q", round, strings.Join(args, " "), out)
			}
		}
	}
}

// runnable is how many other processes (threads, as the kernel counts
// them) are running or waiting for a core now: the median of a few looks
// at /proc/loadavg's fourth field, less the one that reads it.
func runnable(tb testing.TB) int {
	tb.Helper()
	var ns []int
	for range 5 {
		b, err := os.ReadFile("/proc/loadavg")
		if err != nil {
			tb.Fatal(err)
		}
		f := strings.Fields(string(b))
		r, _, _ := strings.Cut(f[min(3, len(f)-1)], "/")
		n, err := strconv.Atoi(r)
		if err != nil {
			tb.Fatalf("/proc/loadavg %q: %v", b, err)
		}
		ns = append(ns, n-1)
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(ns)
	return ns[len(ns)/2]
}
