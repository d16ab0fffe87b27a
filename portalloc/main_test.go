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
	"github.com/berth-go/berth/portalloc/internal/testrig"
	"github.com/berth-go/berth/store"
)

// Addresses and ranges the tests share: pickRange for ports a test picks
// itself (freeRun), allocRange for the Allocators' own.
var (
	lo4        = testrig.Lo4
	lo6        = netip.MustParseAddr("::1")
	any4       = netip.MustParseAddr("0.0.0.0")
	any6       = netip.MustParseAddr("::")
	pickRange  = testrig.PickRange
	allocRange = testrig.AllocRange
	freeRun    = testrig.FreeRun
)

// mustAddr parses an address the test writes out.
func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// The test binary doubles as a worker process: each worker mode is a
// testproc role. Files add modes to workers in their init functions.
func TestMain(m *testing.M) {
	// By now the init functions of every file have added their modes.
	for _, mode := range slices.Sorted(maps.Keys(workers)) {
		testproc.Register(mode, func() int {
			if err := workers[mode](context.Background()); err != nil {
				fmt.Println("error:", err)
				return 1
			}
			return 0
		})
	}
	testproc.MaybeRun()
	// Under the race detector a process sleeps a second as it exits, and a
	// test waits for its workers to exit: they need not.
	_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	// Held until the process exits; workers run under their parent's hold,
	// and so do go test -fuzz's workers (fuzz targets bind no port) and a
	// test's child test binary.
	if !slices.ContainsFunc(os.Args[1:], func(a string) bool { return strings.HasPrefix(a, "-test.fuzzworker") }) && os.Getenv(envChildTest) == "" {
		if _, err := testports.Lock(testports.Portalloc); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(m)
}

// envChildTest marks a test binary a test runs as a child, under its
// parent's hold of the test ports.
const envChildTest = "BERTH_TEST_CHILD"

// workers are the worker modes, by name.
var workers = map[string]func(context.Context) error{
	// hold reserves BERTH_TEST_ADDR:BERTH_TEST_PORT (TCP) in
	// BERTH_STATE_DIR, prints "ready" and holds it until stdin closes.
	"hold": func(ctx context.Context) error {
		a, err := portalloc.New(ctx, workerConfig())
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		port, _ := strconv.Atoi(os.Getenv("BERTH_TEST_PORT"))
		addr := netip.MustParseAddr(os.Getenv("BERTH_TEST_ADDR"))
		if _, err := a.Reserve(ctx, portalloc.Request{Addr: addr, Label: "worker"}, uint16(port)); err != nil {
			return err
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	},
	// fill allocates BERTH_TEST_N ports of BERTH_TEST_RANGE and holds
	// them until stdin closes.
	"fill": func(ctx context.Context) error {
		r, err := store.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
		if err != nil {
			return err
		}
		cfg := workerConfig()
		cfg.Range, cfg.AllowEphemeralOverlap = r, true
		a, err := portalloc.New(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		n, _ := strconv.Atoi(os.Getenv("BERTH_TEST_N"))
		for range n {
			if _, err := a.Allocate(ctx, portalloc.Request{Label: "fill"}); err != nil {
				return err
			}
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	},
	// sleeper lives until it is killed.
	"sleeper": func(context.Context) error { select {} },
}

// workerConfig is the Config of a worker: the state directory
// BERTH_STATE_DIR, the mode BERTH_MODE (statestore unless set), and no
// other variable.
func workerConfig() portalloc.Config {
	mode := portalloc.Mode(os.Getenv("BERTH_MODE"))
	if mode == "" {
		mode = portalloc.ModeStateStore
	}
	return portalloc.Config{Mode: mode, StateDir: os.Getenv("BERTH_STATE_DIR"), Range: allocRange, IgnoreEnv: true}
}

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
// (to run as another user), and stops it when tb ends.
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

// readLine reads the next line a worker prints, without its newline.
func readLine(tb testing.TB, p *proc) string {
	tb.Helper()
	line, err := p.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("worker pid %d: %v (said %q)", p.cmd.Process.Pid, err, line)
	}
	return strings.TrimSuffix(line, "\n")
}

// holdInWorker starts a worker process that reserves addr:port in dir and
// returns it once the reservation is made. The worker ends with the test.
func holdInWorker(tb testing.TB, dir string, addr netip.Addr, port uint16) *proc {
	tb.Helper()
	return spawn(tb, "hold", "BERTH_STATE_DIR="+dir, "BERTH_TEST_ADDR="+addr.String(), "BERTH_TEST_PORT="+strconv.Itoa(int(port))).ready(tb)
}

// newAllocator returns an Allocator on a fresh state directory, closed at
// the end of the test, reading no BERTH_* variable. Without a Range it
// allocates from allocRange. With a StoreDSN it is fleet.New's.
func newAllocator(tb testing.TB, cfg portalloc.Config) *portalloc.Allocator {
	tb.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	if cfg.Range == (store.Range{}) {
		cfg.Range = allocRange
	}
	cfg.IgnoreEnv = true
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
