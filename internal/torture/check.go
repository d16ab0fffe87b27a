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
	pid        int
	start, end int64 // end math.MaxInt64: held to the end of the run
	child      int   // the child a handoff was transferred to
	handoff    bool
}

func (c claim) String() string {
	return fmt.Sprintf("%s %s by pid %d", c.proto, netip.AddrPortFrom(c.addr, c.port), c.pid)
}

// Report is what the checker proved, or failed to, from the logs.
type Report struct {
	Grants, Allocations, Reservations, Handoffs int
	Exhausted                                   int
	Kills                                       int
	BindFailures                                int
	Errors                                      []string
	Violations                                  []string
	ReapedByWorkers                             int64
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
		byPID     = map[int][]Event{}
		kills     = map[int]int64{}
		childExit = map[int]int64{}
		reaped    = map[int]int64{}
	)
	for _, f := range files {
		evs, err := readLog(f)
		if err != nil {
			return rep, err
		}
		for _, e := range evs {
			switch e.Kind {
			case KindKill:
				kills[e.PID] = e.T
				rep.Kills++
			case KindChildExit:
				childExit[e.PID] = e.T
			case KindChildBind:
				if e.Err != "" {
					rep.BindFailures++
					rep.Violations = append(rep.Violations, fmt.Sprintf("child pid %d could not bind %s %s:%d it was handed: %s", e.PID, e.Proto, e.Addr, e.Port, e.Err))
				}
			default:
				byPID[e.PID] = append(byPID[e.PID], e)
			}
		}
	}

	var claims []*claim
	for pid, evs := range byPID {
		open := map[string]*claim{}
		for _, e := range evs {
			key := e.Proto + " " + e.Addr + " " + fmt.Sprint(e.Port)
			switch e.Kind {
			case KindGrant:
				a, err := netip.ParseAddr(e.Addr)
				if err != nil {
					return rep, fmt.Errorf("log of pid %d: %w", pid, err)
				}
				c := &claim{proto: e.Proto, addr: a, port: e.Port, pid: pid, start: e.T, end: math.MaxInt64, handoff: e.Handoff}
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
				reaped[pid] = max(reaped[pid], e.Reaped)
			case KindBind:
				if e.Err != "" {
					rep.BindFailures++
					rep.Violations = append(rep.Violations, fmt.Sprintf("pid %d could not bind %s it was granted: %s", pid, key, e.Err))
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
				rep.Errors = append(rep.Errors, fmt.Sprintf("pid %d: %s", pid, e.Err))
			case KindExit:
				reaped[pid] = max(reaped[pid], e.Reaped)
			}
		}
		// A killed worker's claims end when it was killed.
		if t, ok := kills[pid]; ok {
			for _, c := range open {
				c.end = min(c.end, t)
			}
		}
	}
	for _, c := range claims {
		if c.child != 0 {
			if t, ok := childExit[c.child]; ok {
				c.end = t
			}
		}
	}
	for _, n := range reaped {
		rep.ReapedByWorkers += n
	}
	rep.Violations = append(rep.Violations, overlaps(claims)...)
	slices.Sort(rep.Latencies)
	return rep, nil
}

// overlaps returns a violation for every two claims of one protocol and
// port whose addresses conflict and whose times overlap.
func overlaps(claims []*claim) []string {
	groups := map[string][]*claim{}
	for _, c := range claims {
		k := c.proto + fmt.Sprint(c.port)
		groups[k] = append(groups[k], c)
	}
	var out []string
	for _, g := range groups {
		slices.SortFunc(g, func(a, b *claim) int { return compare(a.start, b.start) })
		for i, a := range g {
			for _, b := range g[i+1:] {
				if b.start >= a.end {
					break
				}
				if netaddr.Conflicts(a.addr, b.addr) {
					out = append(out, fmt.Sprintf("double grant: %s from %s until %s overlaps %s from %s", a, stamp(a.start), stamp(a.end), b, stamp(b.start)))
				}
			}
		}
	}
	return out
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
