package statestore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// The test binary doubles as a worker process: each worker mode is a
// testproc role, which TestMain runs instead of the tests. Workers print one
// JSON line per event on stdout and wait for stdin to close before they
// exit, so the parent decides how long their reservations live.
func TestMain(m *testing.M) {
	// By now the init functions of every file have added their modes.
	modes := append([]string{"open", "random", "hold", "locker"}, slices.Sorted(maps.Keys(extraWorkers))...)
	for _, mode := range modes {
		testproc.Register(mode, func() int {
			if err := runWorker(mode); err != nil {
				fmt.Fprintln(os.Stderr, "worker:", err)
				return 1
			}
			return 0
		})
	}
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}

type event struct {
	Event    string `json:"event"`
	Protocol string `json:"protocol,omitempty"`
	Addr     string `json:"addr,omitempty"`
	Port     uint16 `json:"port,omitempty"`
	Error    string `json:"error,omitempty"`
}

func runWorker(mode string) error {
	ctx := context.Background()
	db := os.Getenv("BERTH_TEST_DB")
	out := json.NewEncoder(os.Stdout)
	wait := func() { _, _ = io.Copy(io.Discard, os.Stdin) }
	switch mode {
	case "open":
		// Wait for the go signal (one byte), then open at once.
		_, _ = os.Stdin.Read(make([]byte, 1))
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return out.Encode(event{Event: "error", Error: err.Error()})
		}
		_ = out.Encode(event{Event: "opened"})
		return s.Close()
	case "random":
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return err
		}
		defer s.Close()
		_, _ = os.Stdin.Read(make([]byte, 1)) // all workers start together
		lo, _ := strconv.Atoi(os.Getenv("BERTH_TEST_LO"))
		n, _ := strconv.Atoi(os.Getenv("BERTH_TEST_N"))
		addrs := []string{"127.0.0.1", "0.0.0.0", "::1", "::"}
		for range n {
			key := store.Key{
				Protocol: store.TCP,
				Addr:     netip.MustParseAddr(addrs[rand.IntN(len(addrs))]),
				Port:     uint16(lo + rand.IntN(300)),
			}
			if _, err := s.Reserve(ctx, store.Request{Key: key}); err == nil {
				_ = out.Encode(event{Event: "grant", Protocol: "tcp", Addr: key.Addr.String(), Port: key.Port})
			} else if !isHeld(err) {
				return err
			}
		}
		_ = out.Encode(event{Event: "done"})
		wait()
		return nil
	case "hold":
		// Reserve the ports listed in BERTH_TEST_PORTS on 127.0.0.1.
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return err
		}
		defer s.Close()
		var ports []uint16
		if err := json.Unmarshal([]byte(os.Getenv("BERTH_TEST_PORTS")), &ports); err != nil {
			return err
		}
		for _, p := range ports {
			key := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: p}
			if _, err := s.Reserve(ctx, store.Request{Key: key, Label: "held"}); err != nil {
				return err
			}
		}
		_ = out.Encode(event{Event: "done"})
		wait()
		return nil
	case "locker":
		// Hold a SQLite write transaction the way a program outside berth
		// would: no flock, straight BEGIN IMMEDIATE.
		return holdWriteLock(db, wait, out)
	}
	if f, ok := extraWorkers[mode]; ok {
		return f(ctx, db, out, wait)
	}
	return fmt.Errorf("unknown worker mode %q", mode)
}

// extraWorkers are worker modes that test files register for themselves.
var extraWorkers = map[string]func(ctx context.Context, db string, out *json.Encoder, wait func()) error{}

// worker is a running worker process.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events *bufio.Scanner
}

func startWorker(tb testing.TB, mode, db string, env ...string) *worker {
	tb.Helper()
	t := tb
	cmd := testproc.Command(tb, mode)
	cmd.Env = append(cmd.Env, "BERTH_TEST_DB="+db)
	cmd.Env = append(cmd.Env, env...)
	stdin, stdout := testproc.Start(tb, cmd)
	w := &worker{cmd: cmd, stdin: stdin, events: bufio.NewScanner(stdout)}
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
	return w
}

// next returns the worker's next event; it fails the test when the worker
// ends first.
func (w *worker) next(tb testing.TB) event {
	tb.Helper()
	t := tb
	if !w.events.Scan() {
		t.Fatalf("worker pid %d ended without an event (%v)", w.cmd.Process.Pid, w.events.Err())
	}
	var e event
	if err := json.Unmarshal(w.events.Bytes(), &e); err != nil {
		t.Fatalf("worker output %q: %v", w.events.Text(), err)
	}
	return e
}

// until collects events up to and including the first of the given kind.
func (w *worker) until(tb testing.TB, kind string) []event {
	tb.Helper()
	t := tb
	var evs []event
	for {
		e := w.next(t)
		if e.Event == "error" {
			t.Fatalf("worker pid %d: %s", w.cmd.Process.Pid, e.Error)
		}
		evs = append(evs, e)
		if e.Event == kind {
			return evs
		}
	}
}

// kill SIGKILLs the worker and waits until the kernel has reaped it.
func (w *worker) kill(tb testing.TB) {
	tb.Helper()
	t := tb
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
}
