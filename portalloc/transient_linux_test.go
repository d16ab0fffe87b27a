package portalloc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/lease"
	"github.com/berth-go/berth/portalloc/statedir"
)

// A process that runs out of file descriptors must never hand out a port
// another process holds: before, EMFILE made the store look broken, the
// Allocator fell back to the MRU file, which could not read the store
// either, and handed the held port out blind.

func init() { workers["starved"] = starved }

// starvedResult is what a "starved" worker reports, as one JSON line.
type starvedResult struct {
	Port        uint16 `json:"port,omitempty"`
	Backend     string `json:"backend,omitempty"`
	Err         string `json:"err,omitempty"`
	Transient   bool   `json:"transient,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
	Held        bool   `json:"held,omitempty"`
	Exhausted   bool   `json:"exhausted,omitempty"`
	Fallbacks   int64  `json:"fallbacks,omitempty"`
	Blind       int64  `json:"blind,omitempty"`
	Warnings    int    `json:"warnings,omitempty"`
}

// starved lowers its own RLIMIT_NOFILE to BERTH_TEST_NOFILE, then opens an
// Allocator on BERTH_STATE_DIR in BERTH_TEST_MODE with the range
// BERTH_TEST_PORT and the port after it, and allocates (BERTH_TEST_OP
// "allocate") or reserves BERTH_TEST_PORT ("reserve"), or does either for
// a holder under a lease ("lease", "reserve-lease"). It prints a
// starvedResult.
func starved(ctx context.Context) error {
	n, err := strconv.ParseUint(os.Getenv("BERTH_TEST_NOFILE"), 10, 64)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(os.Getenv("BERTH_TEST_PORT"))
	if err != nil {
		return err
	}
	var res starvedResult
	log := funcr.New(func(_, _ string) { res.Warnings++ }, funcr.Options{})
	cfg := portalloc.Config{
		StateDir: os.Getenv("BERTH_STATE_DIR"),
		Mode:     portalloc.Mode(os.Getenv("BERTH_TEST_MODE")),
		Range:    portalloc.Range{First: uint16(port), Last: uint16(port) + 1},
		Timeout:  5 * time.Second,
		Logger:   log,
	}
	// The runtime opens its poller with its first timer; the test is of
	// berth's opens, not the runtime's.
	time.AfterFunc(time.Hour, func() {}).Stop()
	limit := func(n uint64) error {
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return err
		}
		lim.Cur = n
		return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	// With BERTH_TEST_AFTER_NEW set, the limit leaves the Allocator n
	// descriptors beyond those it has open after New, so that the opens
	// of the call itself fail.
	afterNew := os.Getenv("BERTH_TEST_AFTER_NEW") != ""
	if !afterNew {
		if err := limit(n); err != nil {
			return err
		}
	}
	var r portalloc.Reservation
	a, err := portalloc.New(ctx, cfg)
	if err == nil && afterNew {
		if err := testproc.LeaveSpareFDs(int(n)); err != nil {
			return err
		}
	}
	if err == nil {
		l := lease.Lease{Holder: "starved", TTL: time.Second}
		switch os.Getenv("BERTH_TEST_OP") {
		case "reserve":
			r, err = a.Reserve(ctx, portalloc.Request{}, uint16(port))
		case "lease":
			r, err = lease.Allocate(ctx, a, portalloc.Request{}, l)
		case "reserve-lease":
			r, err = lease.Reserve(ctx, a, portalloc.Request{}, uint16(port), l)
		default:
			r, err = a.Allocate(ctx, portalloc.Request{})
		}
		if err == nil && r.Holder != "" {
			// The next run must find P+1 free again; a release that
			// fails leaves a lease of a second.
			_, _ = lease.Release(ctx, a, l.Holder, lease.Filter{})
		}
		st := a.Stats()
		res.Fallbacks, res.Blind = st.Fallbacks, st.Blind
		if err == nil {
			res.Port, res.Backend = r.Port, r.Backend
		}
		_ = a.Close()
	}
	if err != nil {
		res.Err = err.Error()
		res.Transient = errors.Is(err, portalloc.ErrTransient)
		res.Unavailable = errors.Is(err, portalloc.ErrStoreUnavailable)
		res.Held = errors.Is(err, portalloc.ErrPortHeld)
		res.Exhausted = errors.Is(err, portalloc.ErrRangeExhausted)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// runStarved runs a "starved" worker and returns what it reported.
func runStarved(tb testing.TB, dir, mode, op string, afterNew bool, nofile int, port uint16) starvedResult {
	tb.Helper()
	env := []string{
		// Under -race a worker would sleep a second as it exits.
		"GORACE=atexit_sleep_ms=0",
		"BERTH_STATE_DIR=" + dir, "BERTH_TEST_MODE=" + mode, "BERTH_TEST_OP=" + op,
		"BERTH_TEST_NOFILE=" + strconv.Itoa(nofile), "BERTH_TEST_PORT=" + strconv.Itoa(int(port))}
	if afterNew {
		env = append(env, "BERTH_TEST_AFTER_NEW=1")
	}
	p := spawn(tb, "starved", env...)
	line, _ := p.out.ReadString('\n')
	_ = p.stdin.Close()
	_ = p.cmd.Wait()
	var res starvedResult
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		tb.Fatalf("starved worker (mode %q, %s, RLIMIT_NOFILE %d) said %q", mode, op, nofile, line)
	}
	return res
}

// TestOutOfDescriptorsNeverHandsOutAHeldPort sweeps RLIMIT_NOFILE from
// where a Go program can hardly open anything up to where everything
// works, so that each open berth makes fails in some run, while another
// process holds port P reserved. The range is P and P+1. Every run either
// fails with an error that names the cause, or hands out P+1; none hands
// out P, and in the default mode none falls back to the MRU file.
func TestOutOfDescriptorsNeverHandsOutAHeldPort(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts about 240 processes")
	}

	dir := t.TempDir()
	held := freeRun(t, 2)
	holdInWorker(t, dir, lo4, held)

	outcomes := map[string]int{}
	for _, c := range []struct {
		mode, op string
		afterNew bool // the limit leaves nofile descriptors spare after New
		from, to int  // the sweep of RLIMIT_NOFILE, or of the spare ones
	}{
		{"", "allocate", false, 4, 40},
		{"", "reserve", false, 4, 40},
		{string(portalloc.ModeMRU), "allocate", false, 4, 40},
		{string(portalloc.ModeStateStore), "allocate", false, 4, 40},
		{"", "allocate", true, 0, 12},
		{"", "reserve", true, 0, 12},
		{string(portalloc.ModeStateStore), "lease", true, 0, 12},
		{string(portalloc.ModeStateStore), "reserve-lease", true, 0, 12},
		{string(portalloc.ModeMRU), "allocate", true, 0, 12},
	} {
		for nofile := c.from; nofile <= c.to; nofile++ {
			if c.mode == string(portalloc.ModeMRU) {
				// A port the MRU file handed out in an earlier run
				// stays recent; each run starts afresh.
				if err := os.Remove(filepath.Join(dir, statedir.MRUFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Fatal(err)
				}
			}
			res := runStarved(t, dir, c.mode, c.op, c.afterNew, nofile, held)
			what := fmt.Sprintf("mode %q, %s, RLIMIT_NOFILE %d (after New: %v): %+v", c.mode, c.op, nofile, c.afterNew, res)
			switch {
			case res.Err == "" && res.Port == held:
				t.Errorf("%s: handed out port %d, which another process holds", what, held)
			case res.Err == "" && (c.op == "reserve" || c.op == "reserve-lease"):
				t.Errorf("%s: reserved port %d, which another process holds", what, held)
			case res.Err == "" && res.Port != held+1:
				t.Errorf("%s: handed out port %d, outside the range %d-%d", what, res.Port, held, held+1)
			case res.Err == "":
				outcomes["served from "+res.Backend]++
			case res.Transient:
				if !strings.Contains(res.Err, "too many open files") || !res.Unavailable && !strings.Contains(res.Err, "MRU file") && !strings.Contains(res.Err, "probe") {
					t.Errorf("%s: want an error that says too many files are open, and where", what)
				}
				outcomes["too many open files"]++
			case res.Held, res.Exhausted:
				// P is held (reserve), or P+1 was handed out by the
				// MRU file in an earlier run and is still recent.
				outcomes["held or exhausted"]++
			default:
				t.Errorf("%s: want a port or an error wrapping ErrTransient, ErrPortHeld or ErrRangeExhausted", what)
			}
			if c.mode == "" && (res.Fallbacks != 0 || res.Backend == portalloc.BackendMRU) {
				t.Errorf("%s: fell back to the MRU file; a shortage of descriptors is no reason to", what)
			}
			if res.Blind != 0 {
				t.Errorf("%s: served blind", what)
			}
		}
	}
	t.Logf("outcomes: %v", outcomes)
	if outcomes["too many open files"] == 0 {
		t.Error("no run ran out of descriptors: the sweep tests nothing")
	}
	if outcomes["served from "+portalloc.BackendStateStore] == 0 {
		t.Error("no run was served from the store: the sweep never reached a working limit")
	}
}
