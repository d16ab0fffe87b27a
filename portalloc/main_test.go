package portalloc_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
)

// The test binary doubles as a worker process: each worker mode is a
// testproc role. A "hold" worker reserves BERTH_TEST_ADDR:BERTH_TEST_PORT
// in BERTH_STATE_DIR, prints "ready" and holds it until stdin closes.
func TestMain(m *testing.M) {
	// By now the init functions of every file have added their modes.
	modes := append([]string{"hold", "fill", "churn", "locker", "sleeper"}, slices.Sorted(maps.Keys(workers))...)
	for _, mode := range modes {
		testproc.Register(mode, func() int {
			if err := runWorker(mode); err != nil {
				fmt.Println("error:", err)
				return 1
			}
			return 0
		})
	}
	testproc.MaybeRun()
	// Held until the process exits; workers run under their parent's hold,
	// and so do go test -fuzz's workers (fuzz targets bind no port).
	if !slices.ContainsFunc(os.Args[1:], func(a string) bool { return strings.HasPrefix(a, "-test.fuzzworker") }) {
		if _, err := testports.Lock(testports.Portalloc); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
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
		if _, err := a.Reserve(ctx, portalloc.Request{Addr: addr, Label: "worker"}, uint16(port)); err != nil {
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
	case "sleeper":
		// A child that lives until it is killed.
		select {}
	}
	if w, ok := workers[mode]; ok {
		return w(ctx)
	}
	return fmt.Errorf("unknown worker mode %q", mode)
}

// workers are the worker modes defined in OS-specific test files.
var workers = map[string]func(context.Context) error{}

// proc is a worker process: this test binary re-run in a worker mode.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// spawn starts the test binary as a worker of the given mode with extra
// environment. The worker is killed, if still running, when tb ends.
func spawn(tb testing.TB, mode string, env ...string) *proc {
	tb.Helper()
	cmd := testproc.Command(tb, mode)
	cmd.Env = append(cmd.Env, env...)
	return start(tb, cmd)
}

// start starts a worker cmd made by testproc.Command, possibly rewrapped
// (to run in a network namespace), and stops it when tb ends.
func start(tb testing.TB, cmd *exec.Cmd) *proc {
	tb.Helper()
	stdin, stdout := testproc.Start(tb, cmd)
	tb.Cleanup(func() {
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
	return &proc{cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<20)}
}

// ready waits for the worker's "ready" line.
func (p *proc) ready(tb testing.TB) *proc {
	tb.Helper()
	if line, _ := p.out.ReadString('\n'); line != "ready\n" {
		tb.Fatalf("worker pid %d said %q", p.cmd.Process.Pid, line)
	}
	return p
}

// kill SIGKILLs the worker and waits until it is gone.
func (p *proc) kill(tb testing.TB) {
	tb.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		tb.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// holdInWorker starts a worker process that reserves addr:port in dir and
// returns it once the reservation is made. The worker ends with the test.
func holdInWorker(tb testing.TB, dir string, addr netip.Addr, port uint16) *proc {
	tb.Helper()
	return spawn(tb, "hold", "BERTH_STATE_DIR="+dir, "BERTH_TEST_ADDR="+addr.String(), "BERTH_TEST_PORT="+strconv.Itoa(int(port))).ready(tb)
}

// newAllocator returns an Allocator on a fresh state directory, closed at
// the end of the test. Without a Range it allocates from allocRange. With
// a Store it is fleet.New's.
func newAllocator(tb testing.TB, cfg portalloc.Config) *portalloc.Allocator {
	tb.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	if cfg.Range == (portalloc.Range{}) {
		cfg.Range = allocRange
	}
	newFn := portalloc.New
	if cfg.StoreDSN != "" {
		newFn = fleet.New // portalloc links no PostgreSQL client
	}
	a, err := newFn(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return a
}

// readLine reads the next line a worker prints, without its newline.
func readLine(tb testing.TB, p *proc) string {
	tb.Helper()
	line, err := p.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("worker pid %d: %v (said %q)", p.cmd.Process.Pid, err, line)
	}
	return strings.TrimSuffix(line, "\n")
}
