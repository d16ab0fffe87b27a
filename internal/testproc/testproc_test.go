package testproc_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testproc"
)

func init() {
	// echo prints its role, its arguments and an environment variable,
	// then exits 3.
	testproc.Register("echo", func() int {
		fmt.Printf("role=%s args=%s x=%s\n", testproc.Role(), strings.Join(os.Args[1:], " "), os.Getenv("TESTPROC_X"))
		return 3
	})
	// wait says it is up, reads stdin to its end and lives on until it is
	// killed.
	testproc.Register("wait", func() int {
		fmt.Println("up")
		_, _ = io.Copy(io.Discard, os.Stdin)
		time.Sleep(time.Hour)
		return 0
	})
}

func TestMain(m *testing.M) {
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}

// TestCommand: the worker runs its role, with the flags that keep it from
// running tests, the caller's arguments and environment, and exits with
// the role's code.
func TestCommand(t *testing.T) {
	cmd := testproc.Command(t, "echo", "a", "b")
	cmd.Env = append(cmd.Env, "TESTPROC_X=y")
	out, err := cmd.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("worker exit: %v; want exit status 3", err)
	}
	want := "role=echo args=-test.run=^$ -test.bench=^$ a b x=y\n"
	if string(out) != want {
		t.Errorf("worker printed %q; want %q", out, want)
	}
}

// TestCommandKillsAtCleanup: a worker still running when its test ends is
// killed.
func TestCommandKillsAtCleanup(t *testing.T) {
	var cmd *exec.Cmd
	t.Run("start", func(t *testing.T) {
		cmd = testproc.Command(t, "wait")
		cmd.Stdin = strings.NewReader("") // not a pipe: closing it does not end the worker
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "up\n" {
			t.Fatalf("worker said %q (%v); want up", line, err)
		}
	})
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != -1 {
			t.Errorf("worker after its test ended: %v; want killed by a signal", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("worker still running 10s after its test ended")
	}
}

// TestUnknownRole: a worker started with a role no one registered says so
// and exits 2.
func TestUnknownRole(t *testing.T) {
	cmd := testproc.Command(t, "echo")
	cmd.Env = append(cmd.Env, testproc.EnvRole+"=nosuch")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), `"nosuch": no such role; registered: echo, wait`) {
		t.Errorf("worker in an unknown role: %v, output %q; want exit status 2 naming the registered roles", err, out)
	}
}
