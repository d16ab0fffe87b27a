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
	"github.com/berth-go/berth/store"
)

// A process that runs out of file descriptors must never hand out a port
// another process holds: a shortage is no reason to fall back to the MRU
// file, and every grant's lock and probe fail closed.

func init() { workers["starved"] = starved }

// starvedResult is what a "starved" worker reports, as one JSON line.
type starvedResult struct {
	Port        uint16 `json:"port,omitempty"`
	Fallback    bool   `json:"fallback,omitempty"`
	Err         string `json:"err,omitempty"`
	Transient   bool   `json:"transient,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
	Held        bool   `json:"held,omitempty"`
	Exhausted   bool   `json:"exhausted,omitempty"`
	NotFound    bool   `json:"notfound,omitempty"`
	Fallbacks   int64  `json:"fallbacks,omitempty"`
	Warnings    int    `json:"warnings,omitempty"`
}

// starved lowers its own RLIMIT_NOFILE to BERTH_TEST_NOFILE, then opens an
// Allocator on BERTH_STATE_DIR in BERTH_TEST_MODE with the range
// BERTH_TEST_PORT and the port after it, and allocates (BERTH_TEST_OP
// "allocate") or reserves BERTH_TEST_PORT ("reserve"), or does either for
// a named holder ("lease", "reserve-lease"). It prints a starvedResult.
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
		StateDir:              os.Getenv("BERTH_STATE_DIR"),
		Mode:                  portalloc.Mode(os.Getenv("BERTH_TEST_MODE")),
		Range:                 store.Range{First: uint16(port), Last: uint16(port) + 1},
		AllowEphemeralOverlap: true,
		Timeout:               5 * time.Second,
		Logger:                log,
		IgnoreEnv:             true,
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
	var r store.Reservation
	a, err := portalloc.New(ctx, cfg)
	if err == nil && afterNew {
		if err := testproc.LeaveSpareFDs(int(n)); err != nil {
			return err
		}
	}
	if err == nil {
		holder := portalloc.Request{Holder: os.Getenv("BERTH_TEST_HOLDER"), TTL: 2 * time.Second}
		switch os.Getenv("BERTH_TEST_OP") {
		case "reserve":
			r, err = a.Reserve(ctx, portalloc.Request{}, uint16(port))
		case "lease":
			r, err = a.Allocate(ctx, holder)
		case "reserve-lease":
			r, err = a.Reserve(ctx, holder, uint16(port))
		case "renew":
			_, err = a.Renew(ctx, holder.Holder, holder.TTL)
		default:
			r, err = a.Allocate(ctx, portalloc.Request{})
		}
		if err == nil && r.Owner.Holder != "" {
			// The next run must find P+1 free again; a release that
			// fails leaves a lease of two seconds.
			_ = a.Release(ctx, r)
		}
		st := a.Stats()
		res.Fallbacks = st.Fallbacks
		if err == nil {
			res.Port, res.Fallback = r.Port, st.Fallback != ""
		}
		_ = a.Close()
	}
	if err != nil {
		res.Err = err.Error()
		res.Transient = errors.Is(err, store.ErrTransient)
		res.Unavailable = errors.Is(err, store.ErrUnavailable)
		res.Held = errors.Is(err, store.ErrHeld)
		res.Exhausted = errors.Is(err, store.ErrExhausted)
		res.NotFound = errors.Is(err, store.ErrNotFound)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// runStarved runs a "starved" worker and returns what it reported.
func runStarved(tb testing.TB, dir, mode, op string, afterNew bool, nofile int, port uint16, holder string) starvedResult {
	tb.Helper()
	env := []string{
		"BERTH_STATE_DIR=" + dir, "BERTH_TEST_MODE=" + mode, "BERTH_TEST_OP=" + op, "BERTH_TEST_HOLDER=" + holder,
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
		t.Skip("skipping: starts about 180 processes")
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
		// Here everything works from about 16 descriptors, and from 12
		// spare after New (a holder's keeper needs the most).
		{"", "allocate", false, 4, 30},
		{"", "reserve", false, 4, 30},
		{string(portalloc.ModeMRU), "allocate", false, 4, 30},
		{string(portalloc.ModeStateStore), "allocate", false, 4, 30},
		{"", "allocate", true, 0, 16},
		{"", "reserve", true, 0, 16},
		{string(portalloc.ModeStateStore), "lease", true, 0, 16},
		{string(portalloc.ModeStateStore), "reserve-lease", true, 0, 16},
		{string(portalloc.ModeMRU), "allocate", true, 0, 16},
	} {
		for nofile := c.from; nofile <= c.to; nofile++ {
			if c.mode == string(portalloc.ModeMRU) {
				// A port the MRU file handed out in an earlier run
				// stays recent; each run starts afresh.
				if err := os.Remove(filepath.Join(dir, "mru.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Fatal(err)
				}
			}
			holder := ""
			if strings.Contains(c.op, "lease") {
				holder = testHolder(t) // a keeper of its own: one that ran short keeps nothing for the next
			}
			res := runStarved(t, dir, c.mode, c.op, c.afterNew, nofile, held, holder)
			what := fmt.Sprintf("mode %q, %s, RLIMIT_NOFILE %d (after New: %v): %+v", c.mode, c.op, nofile, c.afterNew, res)
			switch {
			case res.Err == "" && res.Port == held:
				t.Errorf("%s: handed out port %d, which another process holds", what, held)
			case res.Err == "" && (c.op == "reserve" || c.op == "reserve-lease"):
				t.Errorf("%s: reserved port %d, which another process holds", what, held)
			case res.Err == "" && res.Port != held+1:
				t.Errorf("%s: handed out port %d, outside the range %d-%d", what, res.Port, held, held+1)
			case res.Err == "" && res.Fallback:
				outcomes["served from the MRU file"]++
			case res.Err == "":
				outcomes["served"]++
			case res.Transient:
				if !strings.Contains(res.Err, "too many open files") || !res.Unavailable {
					t.Errorf("%s: want an error wrapping ErrUnavailable that says too many files are open", what)
				}
				outcomes["too many open files"]++
			case res.Held, res.Exhausted:
				// P is held (reserve), or P+1 was handed out by the
				// MRU file in an earlier run and is still recent.
				outcomes["held or exhausted"]++
			default:
				t.Errorf("%s: want a port or an error wrapping ErrTransient, ErrHeld or ErrExhausted", what)
			}
			if c.mode == "" && (res.Fallbacks != 0 || res.Fallback) {
				t.Errorf("%s: fell back to the MRU file; a shortage of descriptors is no reason to", what)
			}
		}
	}
	t.Logf("outcomes: %v", outcomes)
	if outcomes["too many open files"] == 0 {
		t.Error("no run ran out of descriptors: the sweep tests nothing")
	}
	if outcomes["served"] == 0 {
		t.Error("no run was served from the store: the sweep never reached a working limit")
	}
}

// TestRenewOutOfDescriptors: a Renew that cannot ask the holder's keeper
// for want of descriptors (none spare: not even the socket to dial it), of
// a holder the store has no row of, does not say the lease ended
// (ErrNotFound): after a lost store the keeper may still hold its locks.
// It says it ran short.
func TestRenewOutOfDescriptors(t *testing.T) {
	res := runStarved(t, t.TempDir(), string(portalloc.ModeStateStore), "renew", true, 0, freeRun(t, 2), testHolder(t))
	if !res.Transient || res.NotFound {
		t.Errorf("Renew with no descriptor spare = %+v; want an error wrapping ErrTransient, not ErrNotFound", res)
	}
}
