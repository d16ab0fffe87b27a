package owner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
)

// procStat is a /proc/PID/stat line of 52 fields with the given pid,
// comm, state, ppid, startstack (field 28) and arg_start (field 48).
func procStat(pid int, comm string, state byte, ppid int, stack, args uint64) string {
	f := make([]string, 50) // fields 3 to 52
	for i := range f {
		f[i] = "0"
	}
	f[0], f[1], f[17], f[19] = string(state), strconv.Itoa(ppid), "1", "5000"
	f[25], f[45] = strconv.FormatUint(stack, 10), strconv.FormatUint(args, 10)
	return fmt.Sprintf("%d (%s) %s\n", pid, comm, strings.Join(f, " "))
}

// TestInspectFake reads processes from a fake /proc.
func TestInspectFake(t *testing.T) {
	link := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s), Mode: fs.ModeSymlink} }
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	k := &procFS{fsys: fstest.MapFS{
		"100/stat":    file(procStat(100, "bash", 'S', 99, 140723350269584, 140723350272509)),
		"100/exe":     link("/usr/bin/bash"),
		"100/cmdline": file("bash\x00s.sh\x00"),
		"100/fd/0":    link("pipe:[13731]"),
		// Another user's process: no exe, no fd, layout hidden as 0.
		"101/stat":    file(procStat(101, "sh) S 1 (x", 'S', 1, 0, 0)),
		"101/cmdline": file("/bin/sh\x00-c\x00berth get > .port-a\x00"),
		"102/stat":    file(procStat(102, "gone", 'Z', 1, 1, 1)),
		"103/stat":    file("garbage"),
		"104/stat":    file(procStat(105, "liar", 'S', 1, 1, 1)),
		// A kernel before 3.5: the line ends before arg_start.
		"106/stat": file("106 (old) S 1" + strings.Repeat(" 0", 16) + " 1 0 5000" + strings.Repeat(" 0", 20) + "\n"),
	}}
	tests := []struct {
		pid  int
		want Process
	}{
		{100, Process{PID: 100, PPID: 99, Name: "bash", Exe: "/usr/bin/bash", Args: []string{"bash", "s.sh"},
			Layout: "140723350269584 140723350272509", Stdin: "pipe:[13731]"}},
		{101, Process{PID: 101, PPID: 1, Name: "sh) S 1 (x", Args: []string{"/bin/sh", "-c", "berth get > .port-a"}}},
		{106, Process{PID: 106, PPID: 1, Name: "old"}},
	}
	for _, tt := range tests {
		got, err := k.inspect(tt.pid)
		if err != nil {
			t.Errorf("inspect(%d) error = %v; want none", tt.pid, err)
			continue
		}
		if got.PID != tt.want.PID || got.PPID != tt.want.PPID || got.Name != tt.want.Name || got.Exe != tt.want.Exe ||
			!slices.Equal(got.Args, tt.want.Args) || got.Layout != tt.want.Layout || got.Stdin != tt.want.Stdin {
			t.Errorf("inspect(%d) = %+v; want %+v", tt.pid, got, tt.want)
		}
	}
	for _, pid := range []int{102, 107} {
		if _, err := k.inspect(pid); !errors.Is(err, ErrNotRunning) {
			t.Errorf("inspect(%d) error = %v; want ErrNotRunning", pid, err)
		}
	}
	for _, pid := range []int{103, 104} {
		if _, err := k.inspect(pid); err == nil || errors.Is(err, ErrNotRunning) {
			t.Errorf("inspect(%d) error = %v; want an error that is not ErrNotRunning", pid, err)
		}
	}
}

// TestInspectSelf reads the test process itself from the real /proc.
func TestInspectSelf(t *testing.T) {
	ctx := context.Background()
	p, err := Inspect(ctx, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	if p.PID != os.Getpid() || p.PPID != os.Getppid() || p.Exe != exe || !slices.Equal(p.Args, os.Args) || p.Layout == "" {
		t.Errorf("Inspect(self) = %+v; want pid %d, ppid %d, exe %s, args %q and a layout", p, os.Getpid(), os.Getppid(), exe, os.Args)
	}
	if in, _ := os.Readlink("/proc/self/fd/0"); p.Stdin != in {
		t.Errorf("Inspect(self).Stdin = %q; want %q", p.Stdin, in)
	}
	if _, err := Inspect(ctx, 0); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Inspect(0) error = %v; want ErrNotRunning", err)
	}
	if _, err := Inspect(ctx, 99999999); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Inspect(99999999) error = %v; want ErrNotRunning", err)
	}
}

// TestInspectFork: a forked child has its parent's layout until it execs;
// a new start of the same program has another.
func TestInspectFork(t *testing.T) {
	ctx := context.Background()
	if b, err := os.ReadFile("/proc/sys/kernel/randomize_va_space"); err != nil || strings.TrimSpace(string(b)) == "0" {
		t.Skip("address space randomisation is off: a new start keeps the layout")
	}
	self, err := Inspect(ctx, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	child := mustStartChild(t) // a new start of the test binary
	c, err := Inspect(ctx, child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if c.Exe != self.Exe || c.Layout == self.Layout {
		t.Errorf("Inspect(new start of the test binary) = exe %s, layout %q; want exe %s and a layout other than %q", c.Exe, c.Layout, self.Exe, self.Layout)
	}

	// A shell's subshell ( ... ) is a fork that never execs.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to fork a subshell")
	}
	cmd := exec.Command(sh, "-c", "(read x; :); :")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	// Read the shell once it runs as the shell: right after Start it may
	// still be between fork and exec, with no arguments yet.
	var parent Process
	waitFor(t, func() bool {
		parent, err = Inspect(ctx, cmd.Process.Pid)
		return err != nil || len(parent.Args) > 0
	}, "the shell to exec")
	if err != nil {
		t.Fatal(err)
	}
	var sub Process
	waitFor(t, func() bool {
		sub = childOf(t, cmd.Process.Pid)
		return sub.PID != 0
	}, "the shell to fork its subshell")
	// Read the shell again: its arguments show before its exec has ended,
	// and the kernel sets the stack's start last. By the time the shell
	// forks, its exec is over.
	if parent, err = Inspect(ctx, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if sub.Exe != parent.Exe || !slices.Equal(sub.Args, parent.Args) || sub.Layout != parent.Layout || sub.Layout == "" {
		t.Errorf("Inspect(subshell) = %+v; want the exe, args and layout of its shell %+v", sub, parent)
	}
}

// childOf returns a child of process pid, or the zero Process when it has
// none.
func childOf(tb testing.TB, pid int) Process {
	tb.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := Inspect(context.Background(), n); err == nil && p.PPID == pid {
			return p
		}
	}
	return Process{}
}

// BenchmarkInspect reads the test process from /proc: what berth pays for
// each process it looks at when it chooses a default owner, two or three
// of them for a script.
func BenchmarkInspect(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		if _, err := Inspect(ctx, os.Getpid()); err != nil {
			b.Fatal(err)
		}
	}
}
