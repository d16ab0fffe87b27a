package portalloc_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/portalloc"
)

// The test binary doubles as a worker process, selected by
// BERTH_TEST_WORKER. A "hold" worker reserves BERTH_TEST_ADDR:BERTH_TEST_PORT
// in BERTH_STATE_DIR, prints "ready" and holds it until stdin closes.
func TestMain(m *testing.M) {
	if mode := os.Getenv("BERTH_TEST_WORKER"); mode != "" {
		if err := runWorker(mode); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func runWorker(mode string) error {
	ctx := context.Background()
	switch mode {
	case "hold":
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: os.Getenv("BERTH_STATE_DIR")})
		if err != nil {
			return err
		}
		defer a.Close()
		port, _ := strconv.Atoi(os.Getenv("BERTH_TEST_PORT"))
		addr := netip.MustParseAddr(os.Getenv("BERTH_TEST_ADDR"))
		if _, err := a.Reserve(ctx, portalloc.Request{Address: addr, Label: "worker"}, uint16(port)); err != nil {
			return err
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	case "fill":
		// Allocate BERTH_TEST_N ports of BERTH_TEST_RANGE and hold them.
		r, err := portalloc.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
		if err != nil {
			return err
		}
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: os.Getenv("BERTH_STATE_DIR"), Range: r, AllowEphemeralOverlap: true})
		if err != nil {
			return err
		}
		defer a.Close()
		n, _ := strconv.Atoi(os.Getenv("BERTH_TEST_N"))
		for range n {
			if _, err := a.Allocate(ctx, portalloc.Request{Label: "fill"}); err != nil {
				return err
			}
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	case "churn":
		return churn(ctx)
	case "locker":
		return holdWriteLock(ctx, filepath.Join(os.Getenv("BERTH_STATE_DIR"), "berth.db"))
	case "set", "orch":
		return setWorker(ctx, mode)
	case "sleeper":
		// A child that lives until it is killed.
		select {}
	case "serve":
		return serveInherited()
	}
	return fmt.Errorf("unknown worker mode %q", mode)
}

// holdInWorker starts a worker process that reserves addr:port in dir and
// returns its pid once the reservation is made. The worker ends with the
// test.
func holdInWorker(t *testing.T, dir string, addr netip.Addr, port uint16) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BERTH_TEST_WORKER=hold", "BERTH_STATE_DIR="+dir,
		"BERTH_TEST_ADDR="+addr.String(), "BERTH_TEST_PORT="+strconv.Itoa(int(port)))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("worker said %q", line)
	}
	return cmd.Process.Pid
}

// holdInWorkerProc is holdInWorker that returns the process, for tests that
// kill it.
func holdInWorkerProc(t *testing.T, dir string, port uint16) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BERTH_TEST_WORKER=hold", "BERTH_STATE_DIR="+dir,
		"BERTH_TEST_ADDR=127.0.0.1", "BERTH_TEST_PORT="+strconv.Itoa(int(port)))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("worker said %q", line)
	}
	return cmd
}

// newAllocator returns an Allocator on a fresh state directory, closed at
// the end of the test.
func newAllocator(t *testing.T, cfg portalloc.Config) *portalloc.Allocator {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	a, err := portalloc.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return a
}
