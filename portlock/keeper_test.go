//go:build linux

package portlock_test

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portlock"
)

func needKeepers(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("keepers run on Linux")
	}
}

// held reports whether a lock conflicting with tcp addr:p is held.
func held(tb testing.TB, addr string, p uint16) bool {
	tb.Helper()
	l, err := portlock.Acquire("tcp", mustAddr(addr), p)
	if err == nil {
		_ = l.Close()
		return false
	}
	if !errors.Is(err, portlock.ErrHeld) {
		tb.Fatal(err)
	}
	return true
}

// holders returns the pids List gives for tcp addr:p.
func holders(tb testing.TB, addr string, p uint16) []int {
	tb.Helper()
	hs, err := portlock.List()
	if err != nil {
		tb.Fatal(err)
	}
	for _, h := range hs {
		if h.Network == "tcp" && h.Port == p && h.Addr == mustAddr(addr) {
			return h.PIDs
		}
	}
	return nil
}

// handOver takes tcp 127.0.0.1:p and hands it to k, keeping no copy.
func handOver(tb testing.TB, k portlock.Keeper, ttl time.Duration, p uint16) {
	tb.Helper()
	l, err := portlock.Acquire("tcp", mustAddr("127.0.0.1"), p)
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	if err := k.Hold(ttl, l); err != nil {
		tb.Fatalf("Hold: %v", err)
	}
}

func TestProcessKeeper(t *testing.T) {
	needKeepers(t)
	owner, k := ownedKeeper(t)
	p1, p2 := freshPort(t), freshPort(t)
	handOver(t, k, 0, p1)
	handOver(t, k, 0, p2)
	if !held(t, "127.0.0.1", p1) || !held(t, "127.0.0.1", p2) {
		t.Fatal("the keeper does not hold the locks it was handed")
	}
	// One keeper for the owner, not one per port.
	h1, h2 := holders(t, "127.0.0.1", p1), holders(t, "127.0.0.1", p2)
	if len(h1) != 1 || len(h2) != 1 || h1[0] != h2[0] || h1[0] == os.Getpid() || h1[0] == owner.cmd.Process.Pid {
		t.Fatalf("holders of the two locks = %v, %v; want one keeper process", h1, h2)
	}
	keeperPID := h1[0]
	if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(keeperPID) + "/cmdline"); len(cmdline) < 12 || string(cmdline[:12]) != "berth-keeper" {
		t.Errorf("keeper's command line = %q; want it to start with berth-keeper", cmdline)
	}
	if ok, err := k.Drop("tcp", mustAddr("127.0.0.1"), p1); err != nil || !ok {
		t.Fatalf("Drop = %v, %v; want true", ok, err)
	}
	if held(t, "127.0.0.1", p1) {
		t.Fatal("a dropped lock is still held")
	}
	if ok, err := k.Drop("tcp", mustAddr("127.0.0.1"), p1); err != nil || ok {
		t.Fatalf("Drop of a lock no longer held = %v, %v; want false", ok, err)
	}
	// The owner exits: its keeper lets go, and goes.
	_ = owner.cmd.Process.Kill()
	_ = owner.cmd.Wait()
	eventually(t, "the keeper lets go once its owner exits", func() bool { return !held(t, "127.0.0.1", p2) })
	if raceEnabled && !running(keeperPID) {
		// Built with -race, the keeper sleeps a second as it exits: it
		// must have let go before, not as the exit closed its locks.
		t.Error("the keeper let go only as it exited")
	}
	eventually(t, "the keeper exits", func() bool { return syscall.Kill(keeperPID, 0) != nil })
	if _, err := k.Renew(time.Second); !errors.Is(err, portlock.ErrNoKeeper) {
		t.Fatalf("Renew with no keeper = %v; want ErrNoKeeper", err)
	}
}

func TestKeeperOfExitedProcess(t *testing.T) {
	needKeepers(t)
	owner, k := ownedKeeper(t)
	_ = owner.cmd.Process.Kill()
	_ = owner.cmd.Wait()
	l := acquire(t, "tcp", "127.0.0.1", freshPort(t))
	if err := k.Hold(0, l); err == nil {
		t.Fatal("Hold for an exited process = nil; want an error")
	}
	if _, err := portlock.ProcessKeeper(owner.cmd.Process.Pid); err == nil {
		t.Fatal("ProcessKeeper of an exited pid = nil error")
	}
}

func TestHolderKeeper(t *testing.T) {
	needKeepers(t)
	k := portlock.HolderKeeper("ci/job-" + strconv.Itoa(os.Getpid()) + "-" + t.Name())
	p1, p2 := freshPort(t), freshPort(t)
	handOver(t, k, 300*time.Millisecond, p1)
	handOver(t, k, time.Hour, p2)
	if !held(t, "127.0.0.1", p1) {
		t.Fatal("the keeper does not hold the lock")
	}
	eventually(t, "the lease of 300ms ends", func() bool { return !held(t, "127.0.0.1", p1) })
	if !held(t, "127.0.0.1", p2) {
		t.Fatal("a lease of an hour ended with one of 300ms")
	}
	n, err := k.Renew(200 * time.Millisecond)
	if err != nil || n != 1 {
		t.Fatalf("Renew = %d, %v; want 1", n, err)
	}
	eventually(t, "the renewed lease of 200ms ends", func() bool { return !held(t, "127.0.0.1", p2) })
}

func TestKeeperKilled(t *testing.T) {
	needKeepers(t)
	k := portlock.HolderKeeper("killed-" + strconv.Itoa(os.Getpid()))
	p := freshPort(t)
	handOver(t, k, time.Hour, p)
	pids := holders(t, "127.0.0.1", p)
	if len(pids) != 1 {
		t.Fatalf("holders = %v; want the keeper", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// What the docs say: the locks go with the keeper.
	eventually(t, "the locks go with a killed keeper", func() bool { return !held(t, "127.0.0.1", p) })
	// The next Hold starts another.
	handOver(t, k, time.Hour, p)
	if !held(t, "127.0.0.1", p) {
		t.Fatal("a keeper started again does not hold")
	}
	if ok, err := k.Drop("tcp", mustAddr("127.0.0.1"), p); !ok || err != nil {
		t.Fatalf("Drop = %v, %v", ok, err)
	}
}

func init() {
	roles["dropper"] = func(args []string) int {
		p, _ := strconv.Atoi(args[1])
		ok, err := portlock.HolderKeeper(args[0]).Drop("tcp", netip.MustParseAddr("127.0.0.1"), uint16(p))
		if err == nil && ok {
			os.Stdout.WriteString("dropped\n")
		} else {
			os.Stdout.WriteString("refused\n")
		}
		return 0
	}
}

// TestKeeperAnswersItsUserOnly runs, as another user, a process that asks
// this user's keeper to drop a lock: the keeper does not answer it.
func TestKeeperAnswersItsUserOnly(t *testing.T) {
	needKeepers(t)
	if os.Getuid() != 0 {
		t.Skip("needs root, to run a process as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	holder := "users-" + strconv.Itoa(os.Getpid())
	p := freshPort(t)
	handOver(t, portlock.HolderKeeper(holder), time.Hour, p)
	t.Cleanup(func() { _, _ = portlock.HolderKeeper(holder).Drop("tcp", mustAddr("127.0.0.1"), p) })
	exe := copyForAll(t)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envRole+"=dropper", envArgs+"="+holder+" "+strconv.Itoa(int(p)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dropper: %v", err)
	}
	if string(out) != "refused\n" {
		t.Fatalf("another user's drop: %q; want refused", out)
	}
	if !held(t, "127.0.0.1", p) {
		t.Fatal("another user dropped this user's lock")
	}
}

// copyForAll copies the test binary where another user can run it.
func copyForAll(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "portlock-exe-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		tb.Fatal(err)
	}
	exe := dir + "/portlock.test"
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		tb.Fatal(err)
	}
	return exe
}

func init() {
	roles["holdas"] = func(args []string) int { return roles["hold"](args) }
}

// TestOtherUsersLock: a lock another user holds is held for this one too.
func TestOtherUsersLock(t *testing.T) {
	if runtime.GOOS != "linux" || os.Getuid() != 0 {
		t.Skip("needs root on Linux, to run a process as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	p := freshPort(t)
	cmd := exec.Command(copyForAll(t))
	cmd.Env = append(os.Environ(), envRole+"=holdas", envArgs+"=tcp 127.0.0.1 "+strconv.Itoa(int(p)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	w := &worker{cmd: cmd}
	out, _ := cmd.StdoutPipe()
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = w.cmd.Wait() })
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("worker: %q, %v", buf, err)
	}
	if !held(t, "0.0.0.0", p) {
		t.Fatal("another user's lock is not held for this user")
	}
}

// TestKeeperTake moves a lock from one owner's keeper to another's: it is
// never free on the way.
func TestKeeperTake(t *testing.T) {
	needKeepers(t)
	from := portlock.HolderKeeper("take-from-" + strconv.Itoa(os.Getpid()))
	to := portlock.HolderKeeper("take-to-" + strconv.Itoa(os.Getpid()))
	p := freshPort(t)
	handOver(t, from, time.Hour, p)
	lk, err := from.Take("tcp", mustAddr("127.0.0.1"), p)
	if err != nil || lk == nil {
		t.Fatalf("Take = %v, %v; want the lock", lk, err)
	}
	if !held(t, "127.0.0.1", p) {
		t.Fatal("the lock was let go on its way")
	}
	if err := to.Hold(time.Hour, lk); err != nil {
		t.Fatal(err)
	}
	_ = lk.Close()
	pids := holders(t, "127.0.0.1", p)
	if len(pids) != 1 {
		t.Fatalf("holders after the move = %v; want the new keeper alone", pids)
	}
	if again, err := from.Take("tcp", mustAddr("127.0.0.1"), p); err != nil || again != nil {
		t.Fatalf("Take from a keeper that gave it away = %v, %v; want nil", again, err)
	}
	if ok, err := to.Drop("tcp", mustAddr("127.0.0.1"), p); !ok || err != nil {
		t.Fatalf("Drop = %v, %v", ok, err)
	}
	eventually(t, "the moved lock is free once dropped", func() bool { return !held(t, "127.0.0.1", p) })
}

// running reports whether process pid runs, not exiting or a zombie.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return after != "" && after[0] != 'Z' && after[0] != 'X'
}

// TestKeeperCallsSurviveSignals: a call to a keeper that a signal
// interrupts (the Go runtime preempts goroutines with SIGURG; a program
// may have signals of its own) is made again, not failed with EINTR.
func TestKeeperCallsSurviveSignals(t *testing.T) {
	needKeepers(t)
	_, k := ownedKeeper(t)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				_ = syscall.Kill(os.Getpid(), syscall.SIGURG)
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	p := freshPort(t)
	for range 300 {
		handOver(t, k, 0, p)
		if ok, err := k.Drop("tcp", mustAddr("127.0.0.1"), p); err != nil || !ok {
			t.Fatalf("Drop while signals arrive = %v, %v; want true", ok, err)
		}
	}
}

// ownedKeeper starts an owner process and returns it with its keeper.
func ownedKeeper(t *testing.T) (*worker, portlock.Keeper) {
	t.Helper()
	owner := start(t, "sleep")
	owner.next(t)
	k, err := portlock.ProcessKeeper(owner.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return owner, k
}
