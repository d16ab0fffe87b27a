package owner

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testproc"
)

// The test binary doubles as a child process: in the role "child" it
// waits until its standard input closes, so a test controls exactly when
// its child ends.
func init() {
	testproc.Register("child", func() int {
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	})
}

func TestMain(m *testing.M) {
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}

// startChild starts a copy of the test binary that lives until the test
// ends or it is killed. setup, when given, adjusts the command before it
// starts; an error starting it is returned rather than failing the test.
func startChild(tb testing.TB, setup ...func(*exec.Cmd)) (*exec.Cmd, error) {
	tb.Helper()
	cmd := testproc.Command(tb, "child")
	for _, f := range setup {
		f(cmd)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		_ = stdin.Close()
		return nil, err
	}
	tb.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, nil
}

// mustStartChild is startChild for tests that cannot go on without a child.
func mustStartChild(tb testing.TB) *exec.Cmd {
	tb.Helper()
	cmd, err := startChild(tb)
	if err != nil {
		tb.Fatal(err)
	}
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
	if id.Name == "" {
		t.Error("Self().Name is empty")
	}
	if IsLegacy(id) {
		t.Errorf("IsLegacy(Self()) = true for scope %q; want the current format", id.Scope)
	}
	if !Active(context.Background(), id) {
		t.Error("Active(Self()) = false; want true")
	}
	again, err := Lookup(context.Background(), os.Getpid())
	if err != nil || !again.Same(id) {
		t.Errorf("Lookup(own pid) = %+v, %v; want %+v", again, err, id)
	}
}

func TestChildLifecycle(t *testing.T) {
	ctx := context.Background()
	cmd := mustStartChild(t)
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
	if _, err := Upgrade(ctx, Identity{PID: id.PID, Start: 1}); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Upgrade(legacy identity of reaped child) error = %v; want ErrNotRunning", err)
	}
}

// TestPidReuse: a process with the pid but another start is another
// process, however close the starts. Starts are compared exactly.
func TestPidReuse(t *testing.T) {
	ctx := context.Background()
	me, _ := Self()
	for _, shift := range []int64{1, -1, 2, 100, -100, 1 << 40} {
		id := me
		id.Start += shift
		if Active(ctx, id) {
			t.Errorf("Active(own pid, start %+d) = true; want false", shift)
		}
		if id.Same(me) {
			t.Errorf("Identity(start %+d).Same(Self()) = true; want false", shift)
		}
	}
}

func TestInvalidPid(t *testing.T) {
	ctx := context.Background()
	for _, pid := range []int{0, -1, 1 << 40} {
		if Active(ctx, Identity{PID: pid, Start: 1, Scope: scopeTag}) {
			t.Errorf("Active(pid %d) = true; want false", pid)
		}
		if _, err := Lookup(ctx, pid); !errors.Is(err, ErrNotRunning) {
			t.Errorf("Lookup(%d) error = %v; want ErrNotRunning", pid, err)
		}
		if _, err := Upgrade(ctx, Identity{PID: pid, Start: 1}); !errors.Is(err, ErrNotRunning) {
			t.Errorf("Upgrade(pid %d) error = %v; want ErrNotRunning", pid, err)
		}
	}
}

func TestLookupCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Lookup(ctx, os.Getpid()); !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup(canceled) error = %v; want context.Canceled", err)
	}
}

func TestScopeFormat(t *testing.T) {
	tests := []struct {
		in      string
		want    scope
		current bool
	}{
		{"k1", scope{}, true},
		{"b/k1/4026531836/4026531834", scope{"b", "4026531836", "4026531834"}, true},
		{"b/k1/4026531836/", scope{"b", "4026531836", ""}, true},
		{"/k1//", scope{}, true},
		// Earlier releases.
		{"", scope{}, false},
		{"b", scope{boot: "b"}, false},
		{"b/4026531836", scope{boot: "b", pidNS: "4026531836"}, false},
		{"k1/4026531836", scope{boot: "k1", pidNS: "4026531836"}, false},
	}
	for _, tt := range tests {
		got, current := parseScope(tt.in)
		if got != tt.want || current != tt.current {
			t.Errorf("parseScope(%q) = %+v, %v; want %+v, %v", tt.in, got, current, tt.want, tt.current)
		}
		if IsLegacy(Identity{Scope: tt.in}) == tt.current {
			t.Errorf("IsLegacy(scope %q) = %v; want %v", tt.in, !tt.current, !tt.current)
		}
	}
	for _, sc := range []scope{{}, {"b", "1", "2"}, {"b", "1", ""}, {"", "1", "2"}} {
		if got, current := parseScope(sc.String()); got != sc || !current {
			t.Errorf("parseScope(%q) = %+v, %v; want %+v, true", sc.String(), got, current, sc)
		}
	}
}

func TestUpgradeCurrent(t *testing.T) {
	me, _ := Self()
	got, err := Upgrade(context.Background(), me)
	if err != nil || got != me {
		t.Errorf("Upgrade(Self()) = %+v, %v; want it unchanged", got, err)
	}
}

func TestStartedAt(t *testing.T) {
	me, _ := Self()
	at, ok := StartedAt(me)
	if !ok {
		t.Fatal("StartedAt(Self()) = false; want a time")
	}
	if age := time.Since(at); age < -time.Second || age > time.Hour {
		t.Errorf("StartedAt(Self()) is %v ago; want a recent time", age)
	}
	legacy := Identity{PID: 1, Start: 1_700_000_000_000}
	if at, ok := StartedAt(legacy); !ok || !at.Equal(time.UnixMilli(legacy.Start)) {
		t.Errorf("StartedAt(legacy) = %v, %v; want %v", at, ok, time.UnixMilli(legacy.Start))
	}
	if _, ok := StartedAt(Identity{}); ok {
		t.Error("StartedAt(Identity{}) = true; want false")
	}
}

func waitFor(tb testing.TB, cond func() bool, what string) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
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

// String names a Verdict in the tests' messages.
func (v Verdict) String() string {
	switch v {
	case Dead:
		return "dead"
	case Live:
		return "live"
	}
	return "unknown"
}
