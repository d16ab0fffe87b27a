package owner

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain doubles as a child process: with BERTH_OWNER_CHILD=1 the test
// binary waits until its standard input closes, so a test controls exactly
// when its child ends.
func TestMain(m *testing.M) {
	if os.Getenv("BERTH_OWNER_CHILD") == "1" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// startChild starts a copy of the test binary that lives until the returned
// stop function is called or it is killed.
func startChild(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BERTH_OWNER_CHILD=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func TestSelf(t *testing.T) {
	id, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if id.PID != os.Getpid() {
		t.Errorf("Self().PID = %d; want %d", id.PID, os.Getpid())
	}
	if age := time.Since(time.UnixMilli(id.Start)); age < 0 || age > time.Hour {
		t.Errorf("Self().Start is %v ago; want a recent time", age)
	}
	if id.Name == "" {
		t.Error("Self().Name is empty")
	}
	if runtime.GOOS == "linux" && id.Scope == "" {
		t.Error("Self().Scope is empty on Linux; want boot id and pid namespace")
	}
	if !Active(context.Background(), id) {
		t.Error("Active(Self()) = false; want true")
	}
}

func TestChildLifecycle(t *testing.T) {
	ctx := context.Background()
	cmd := startChild(t)
	id, err := Lookup(ctx, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	me, _ := Self()
	if id.Same(me) {
		t.Fatalf("child identity %+v is the same as the parent's %+v", id, me)
	}
	if !Active(ctx, id) {
		t.Fatal("Active(live child) = false; want true")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Before Wait the child is a zombie: it holds nothing and counts as gone.
	waitFor(t, func() bool { return !Active(ctx, id) }, "killed, unreaped child to count as inactive")
	_ = cmd.Wait()
	if Active(ctx, id) {
		t.Error("Active(reaped child) = true; want false")
	}
	if _, err := Lookup(ctx, id.PID); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Lookup(reaped child) error = %v; want ErrNotRunning", err)
	}
}

func TestPidReuse(t *testing.T) {
	ctx := context.Background()
	me, _ := Self()
	tests := []struct {
		shift time.Duration
		want  bool
	}{
		{0, true},
		{Tolerance, true},
		{-Tolerance, true},
		{Tolerance + time.Millisecond, false},
		{-time.Second, false},
		{time.Hour, false},
	}
	for _, tt := range tests {
		id := me
		id.Start += tt.shift.Milliseconds()
		if got := Active(ctx, id); got != tt.want {
			t.Errorf("Active(own pid, start shifted %v) = %v; want %v", tt.shift, got, tt.want)
		}
	}
}

func TestScope(t *testing.T) {
	ctx := context.Background()
	me, _ := Self()
	if me.Scope == "" {
		t.Skip("this OS gives no boot id or pid namespace")
	}
	boot, ns := splitScope(me.Scope)

	otherBoot := me
	otherBoot.Scope = "00000000-0000-0000-0000-000000000000/" + ns
	if Active(ctx, otherBoot) {
		t.Error("Active(identity from another boot) = true; want false")
	}
	// A pid namespace this process cannot see: the pid means nothing here,
	// so the identity must count as live even though no such pid exists.
	otherNS := Identity{PID: 1 << 30, Start: 1, Scope: boot + "/1"}
	if !Active(ctx, otherNS) {
		t.Error("Active(identity from another pid namespace) = false; want true")
	}
}

func TestInvalidPid(t *testing.T) {
	ctx := context.Background()
	for _, pid := range []int{0, -1, 1 << 40} {
		if Active(ctx, Identity{PID: pid, Start: 1}) {
			t.Errorf("Active(pid %d) = true; want false", pid)
		}
		if _, err := Lookup(ctx, pid); !errors.Is(err, ErrNotRunning) {
			t.Errorf("Lookup(%d) error = %v; want ErrNotRunning", pid, err)
		}
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func BenchmarkActive(b *testing.B) {
	ctx := context.Background()
	me, err := Self()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if !Active(ctx, me) {
			b.Fatal("Active(Self()) = false")
		}
	}
}
