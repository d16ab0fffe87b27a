package torture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
)

// claim is the time a process held a key: from its grant until it released
// it, was killed, or (for a handoff) the child it was given to exited.
type claim struct {
	proto      string
	addr       netip.Addr
	port       uint16
	proc       string
	pid        int
	start, end int64  // end math.MaxInt64: held to the end of the run
	child      string // the child a handoff was transferred to
}

func (c claim) String() string {
	return fmt.Sprintf("%s %s by %s (pid %d)", c.proto, netip.AddrPortFrom(c.addr, c.port), c.proc, c.pid)
}

// maxViolations bounds the violation messages a Report keeps; the count
// goes on.
const maxViolations = 100

// Report is what the checker proved, or failed to, from the logs.
type Report struct {
	Grants, Allocations, Reservations, Handoffs int
	Exhausted                                   int
	Kills                                       int
	BindFailures                                int
	Errors                                      []string
	ReapedByWorkers                             int64
	// Violations describes the first violations; ViolationCount counts
	// them all.
	Violations     []string
	ViolationCount int
	// Latencies of Allocate calls (granted or exhausted), sorted.
	Latencies []time.Duration
}

// Check reads every log under dir/logs and checks that no two claims that
// conflict under the address rule overlap in time, and that every grant was
// bindable by its grantee.
func Check(dir string) (Report, error) {
	var rep Report
	files, err := filepath.Glob(filepath.Join(dir, "logs", "*.jsonl"))
	if err != nil {
		return rep, err
	}
	var (
		byProc    = map[string][]Event{}
		kills     = map[string]int64{}
		childExit = map[string]int64{}
		reaped    = map[string]int64{}
	)
	violate := func(format string, args ...any) {
		rep.ViolationCount++
		if len(rep.Violations) < maxViolations {
			rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
		}
	}
	for _, f := range files {
		evs, err := readLog(f)
		if err != nil {
			return rep, err
		}
		for _, e := range evs {
			switch e.Kind {
			case KindKill:
				kills[e.Proc] = e.T
				rep.Kills++
			case KindChildExit:
				childExit[e.Proc] = e.T
			case KindChildBind:
				if e.Err != "" {
					rep.BindFailures++
					violate("child %s (pid %d) could not bind %s %s:%d it was handed: %s", e.Proc, e.PID, e.Proto, e.Addr, e.Port, e.Err)
				}
			default:
				byProc[e.Proc] = append(byProc[e.Proc], e)
			}
		}
	}

	var claims []*claim
	for proc, evs := range byProc {
		open := map[string]*claim{}
		for _, e := range evs {
			key := e.Proto + " " + e.Addr + " " + fmt.Sprint(e.Port)
			switch e.Kind {
			case KindGrant:
				a, err := netip.ParseAddr(e.Addr)
				if err != nil {
					return rep, fmt.Errorf("log of %s: %w", proc, err)
				}
				c := &claim{proto: e.Proto, addr: a, port: e.Port, proc: proc, pid: e.PID, start: e.T, end: math.MaxInt64}
				claims = append(claims, c)
				open[key] = c
				rep.Grants++
				switch {
				case e.Handoff:
					rep.Handoffs++
				case e.Static:
					rep.Reservations++
				default:
					rep.Allocations++
					rep.Latencies = append(rep.Latencies, time.Duration(e.DurNS))
				}
				reaped[proc] = max(reaped[proc], e.Reaped)
			case KindBind:
				if e.Err != "" {
					rep.BindFailures++
					violate("%s (pid %d) could not bind %s it was granted: %s", proc, e.PID, key, e.Err)
				}
			case KindRelease:
				if c := open[key]; c != nil {
					c.end = e.T
					delete(open, key)
				}
			case KindTransfer:
				if c := open[key]; c != nil {
					c.child = e.Child
					delete(open, key)
				}
			case KindExhausted:
				rep.Exhausted++
				rep.Latencies = append(rep.Latencies, time.Duration(e.DurNS))
			case KindError:
				rep.Errors = append(rep.Errors, fmt.Sprintf("%s (pid %d): %s", proc, e.PID, e.Err))
			case KindExit:
				reaped[proc] = max(reaped[proc], e.Reaped)
			}
		}
		// A killed worker's claims end when it was killed.
		if t, ok := kills[proc]; ok {
			for _, c := range open {
				c.end = min(c.end, t)
			}
		}
	}
	for _, c := range claims {
		if c.child != "" {
			if t, ok := childExit[c.child]; ok {
				c.end = t
			}
		}
	}
	for _, n := range reaped {
		rep.ReapedByWorkers += n
	}
	overlaps(claims, violate)
	slices.Sort(rep.Latencies)
	return rep, nil
}

// overlaps reports a violation for every two claims of one protocol and
// port whose addresses conflict and whose times overlap.
func overlaps(claims []*claim, violate func(string, ...any)) {
	groups := map[string][]*claim{}
	for _, c := range claims {
		k := c.proto + fmt.Sprint(c.port)
		groups[k] = append(groups[k], c)
	}
	for _, g := range groups {
		slices.SortFunc(g, func(a, b *claim) int { return compare(a.start, b.start) })
		for i, a := range g {
			for _, b := range g[i+1:] {
				if b.start >= a.end {
					break
				}
				if netaddr.Conflicts(a.addr, b.addr) {
					violate("double grant: %s from %s until %s overlaps %s from %s", a, stamp(a.start), stamp(a.end), b, stamp(b.start))
				}
			}
		}
	}
}

func compare(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func stamp(t int64) string {
	if t == math.MaxInt64 {
		return "the end"
	}
	return time.Unix(0, t).Format("15:04:05.000000")
}

func readLog(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var evs []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			// A SIGKILL can cut the last line short; anything else is not ours.
			continue
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

// Percentile returns the p-th percentile (0-100) of sorted durations.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
