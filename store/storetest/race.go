package storetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// The worker processes of ProcessesRace are the test binary re-run in this
// role; the environment names the database, and their Config the ports.
const (
	workerRole  = "storetest-race"
	envLocator  = "BERTH_STORETEST_LOCATOR"
	raceWorkers = 4
	raceScans   = 3 // per worker: 12 scans for 8 ports, so the ports run out
)

// registered is set by MaybeRunWorker, so that Run can say what is missing
// instead of failing in each worker.
var registered atomic.Bool

// MaybeRunWorker makes this test binary able to serve as a worker process
// of Run's cross-process case, with c (the Config later given to Run) to
// reach the store and its ports. In a worker process it runs the worker and
// exits; in the test process it returns at once. Call it once, before the tests run:
// first thing in TestMain, or from an init function of a test file.
func MaybeRunWorker(c Config) {
	testproc.Register(workerRole, func() int {
		if err := runWorker(c); err != nil {
			fmt.Printf("error %v\n", err)
			return 1
		}
		return 0
	})
	registered.Store(true)
	if testproc.Role() == workerRole {
		testproc.MaybeRun()
	}
}

// racePortList returns the ports of c.Ports that ProcessesRace binds.
func racePortList(c Config) []uint16 {
	ports := make([]uint16, racePorts)
	for i := range ports {
		ports[i] = c.Ports.First + uint16(i)
	}
	return ports
}

// runWorker opens the store, says "ready", waits for one byte on stdin,
// then scans the candidates of racePortList raceScans times. For each port
// it is granted it listens on 127.0.0.1 and says "grant PORT", or says
// "unbindable PORT ERROR"; a scan that finds no port says "exhausted".
// It says "done" and holds its listeners until stdin closes.
func runWorker(c Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ports := racePortList(c)
	s, err := c.Reopen(ctx, os.Getenv(envLocator))
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	defer func() { _ = s.Close() }()
	fmt.Println("ready")
	if _, err := os.Stdin.Read(make([]byte, 1)); err != nil {
		return fmt.Errorf("wait for the start: %w", err)
	}
	lo := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for range raceScans {
		r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo, Label: "race", Next: Candidates(ports...),
			Probe: func(k store.Key) error {
				free, err := portlock.Probe("tcp", k.Addr, k.Port)
				if err == nil && !free {
					err = &store.ConflictError{Key: k, Bound: true}
				}
				return err
			}})
		switch {
		case errors.Is(err, store.ErrExhausted):
			fmt.Println("exhausted")
			continue
		case err != nil:
			return fmt.Errorf("scan: %w", err)
		}
		l, err := net.Listen("tcp", netip.AddrPortFrom(lo, r.Port).String())
		if err != nil {
			fmt.Printf("unbindable %d %v\n", r.Port, err)
			continue
		}
		held = append(held, l)
		fmt.Printf("grant %d\n", r.Port)
	}
	fmt.Println("done")
	_, _ = io.Copy(io.Discard, os.Stdin) // hold the ports until told to stop
	return nil
}

// raceWorker is a running worker process of ProcessesRace.
type raceWorker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines <-chan string // closed when the worker's stdout ends
}

// startRaceWorker starts a worker on the database locator names. When t
// ends it closes the worker's stdin and waits for it to exit (killing it
// after a while), and for its output to be read.
func startRaceWorker(tb testing.TB, locator string) *raceWorker {
	tb.Helper()
	cmd := testproc.Command(tb, workerRole)
	cmd.Env = append(cmd.Env, envLocator+"="+locator)
	stdin, stdout := testproc.Start(tb, cmd)
	lines := make(chan string)
	var reading sync.WaitGroup
	reading.Go(func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	})
	tb.Cleanup(func() {
		_ = stdin.Close()
		// Drain what is left, so the reader ends with the worker.
		go func() {
			for range lines {
			}
		}()
		exited := make(chan struct{})
		go func() { reading.Wait(); _ = cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	return &raceWorker{cmd: cmd, stdin: stdin, lines: lines}
}

// next returns the worker's next line, failing t when the worker ends or
// says nothing before deadline.
func (w *raceWorker) next(tb testing.TB, deadline <-chan time.Time) string {
	tb.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			tb.Fatalf("worker pid %d ended early", w.cmd.Process.Pid)
		}
		if strings.HasPrefix(l, "error ") {
			tb.Fatalf("worker pid %d: %s", w.cmd.Process.Pid, l)
		}
		return l
	case <-deadline:
		tb.Fatalf("worker pid %d said nothing for too long", w.cmd.Process.Pid)
	}
	return ""
}

// testProcessesRace: see ProcessesRace in the package doc.
func testProcessesRace(t *testing.T, f fixture) {
	ports := racePortList(f.c)
	workers := make([]*raceWorker, raceWorkers)
	for i := range workers {
		workers[i] = startRaceWorker(t, f.locator)
	}
	deadline := time.After(2 * time.Minute)
	for _, w := range workers {
		if l := w.next(t, deadline); l != "ready" {
			t.Fatalf("worker pid %d said %q; want ready", w.cmd.Process.Pid, l)
		}
	}
	// Every worker has opened the store: start them together.
	for _, w := range workers {
		if _, err := w.stdin.Write([]byte{1}); err != nil {
			t.Fatalf("start worker pid %d: %v", w.cmd.Process.Pid, err)
		}
	}
	grantedTo := map[uint16]int{} // port -> pid
	exhausted := 0
	for _, w := range workers {
		pid := w.cmd.Process.Pid
		for l := w.next(t, deadline); l != "done"; l = w.next(t, deadline) {
			verb, arg, _ := strings.Cut(l, " ")
			switch verb {
			case "exhausted":
				exhausted++
			case "grant":
				p, err := strconv.ParseUint(arg, 10, 16)
				if err != nil {
					t.Fatalf("worker pid %d said %q", pid, l)
				}
				if other, dup := grantedTo[uint16(p)]; dup {
					t.Errorf("port %d granted to pid %d and to pid %d", p, other, pid)
				}
				grantedTo[uint16(p)] = pid
			case "unbindable":
				t.Errorf("worker pid %d was granted a port it could not bind: %s; want every grant bindable (the port granted twice, or not probed)", pid, arg)
			default:
				t.Fatalf("worker pid %d said %q", pid, l)
			}
		}
	}
	if got := slices.Sorted(maps.Keys(grantedTo)); !slices.Equal(got, ports) {
		t.Errorf("%d workers scanning %v %d times each were granted %v; want every port once", raceWorkers, ports, raceScans, got)
	}
	if want := raceWorkers*raceScans - len(ports); exhausted != want {
		t.Errorf("%d scans found the ports exhausted; want %d, one for each scan beyond the %d ports", exhausted, want, len(ports))
	}
	// The kernel agrees: each granted port is held by its worker now.
	for p, pid := range grantedTo {
		l, err := net.Listen("tcp", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), p).String())
		if err == nil {
			_ = l.Close()
			t.Errorf("port %d, granted to pid %d, is free; want the worker listening on it", p, pid)
		}
	}
	// And so does the store the test opened first.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := f.s.List(ctx, store.Filter{Label: "race"})
	if err != nil {
		t.Fatalf("List = %v", err)
	}
	inStore := map[uint16]int{}
	for _, r := range rows {
		if other, dup := inStore[r.Port]; dup {
			t.Errorf("the store has port %d twice, for pid %d and pid %d", r.Port, other, r.Owner.PID)
		}
		inStore[r.Port] = r.Owner.PID
	}
	if !maps.Equal(inStore, grantedTo) {
		t.Errorf("the store's rows give ports to pids %v; the workers were granted %v", inStore, grantedTo)
	}
}
