package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
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
	host       string // the fleet host; "" on one machine and for fleet-wide claims
	fleet      bool   // a fleet-wide grant: held on every host
	proto      string
	addr       netip.Addr
	port       uint16
	proc       string
	pid        int
	start, end int64  // end math.MaxInt64: held to the end of the run
	child      string // the child a handoff was transferred to
	// holder names the holder of a lease's claim ("" for a process's
	// claim), which lasts until its release or its expiry (the start of
	// its last grant or renewal plus its TTL), whoever lives.
	holder string
	expiry int64
	asked  int64 // when the call that granted it began: a commit of it may reach the store from then on
	// failWin holds the times in which the row of a hand-off's claim may have been
	// missing from the store after an asynchronous failover, with nobody to put it back
	// (the child runs no berth code): from the failover until the child's exit. Every
	// other holder puts its rows back within the grace period, which holds every other
	// grant meanwhile.
	failWin []span
	// released is when the worker's release of the claim returned (its
	// end is when the worker logged it, before the call), when its worker,
	// killed, was gone, or when the child it was handed to was reaped (its
	// end is the child's exit): the lock goes after the row, or with the
	// process, so in between the port may be locked with no row.
	released int64
	ofKilled bool // its worker was killed holding it
}

func (c claim) String() string {
	on := ""
	switch {
	case c.fleet:
		on = " fleet-wide"
	case c.host != "":
		on = " on " + c.host
	}
	if c.holder != "" {
		on += fmt.Sprintf(" under the lease of %q", c.holder)
	}
	return fmt.Sprintf("%s %s%s by %s (pid %d)", c.proto, netip.AddrPortFrom(c.addr, c.port), on, c.proc, c.pid)
}

// maxViolations bounds the violation messages a Report keeps.
const maxViolations = 100

// Report is what the checker proved, or failed to, from the logs. Counts
// of fleet-wide grants and of leases are also in Grants.
type Report struct {
	Grants, Allocations, Reservations, Handoffs int
	Exhausted, Kills, BindFailures              int
	// FleetBinds counts the binds of fleet-wide grants, one per host;
	// FleetExhausted the times a fleet worker found no port free on every
	// host; LeaseRefusals the Reserve calls of hosts' workers refused for
	// a fleet-wide lease.
	FleetGrants, FleetBinds, FleetExhausted, LeaseRefusals int
	// ProbeFailures counts the workers' bind probes that failed: ports
	// the store let a worker claim but that something had bound. The
	// probe keeps such a port from being granted; across hosts, where
	// only the run binds, each is a double grant of the store's.
	ProbeFailures int64
	Retirements   int   // hosts retired while the workers ran
	RetiredRows   int64 // rows the retirements deleted
	StoreLosses   int   // times the store was lost under the workers
	// LeaseReservations counts the leases granted by Reserve.
	// LeaseExpiries counts the leases that ran out before any release:
	// LeaseDrops of them dropped by their worker, KilledLeases held by a
	// killed worker, the rest not renewed in time (a frozen or slow
	// worker). LeasesEnded counts the renewals that found the lease ended.
	// A lost store loses no lease: its lock, which its holder's keeper
	// keeps, still guards it, so a conflict over one is a violation.
	LeaseGrants, LeaseReservations, Renewals, LeaseReleases int
	LeaseExpiries, LeaseDrops, KilledLeases, LeasesEnded    int
	// LostCalls counts the calls that failed because the store's file was
	// lost under them, each attempt: opens, mostly, which the worker makes
	// again.
	LostCalls int
	// Of -fd-pressure: the spells, the calls that failed with
	// store.ErrTransient, the workers' binds refused for want of
	// descriptors (made again after the spell), the children not started.
	PressureSpells, Transients, EMFILEBinds, Shortages int
	// The server's restarts and failovers, and the slowest of each (a
	// failover from the SIGKILL to the new standby streaming).
	Restarts, Failovers             int
	LongestRestart, LongestFailover time.Duration
	// Repairs counts the workers' comparisons of their reservations with
	// the store after it changed server: the rows they put back, those
	// they could not (another process had the port), the releases they
	// did again. Unavailable counts the calls that failed on a server out
	// of reach.
	Repairs, Unavailable              int
	Restored, NotRestored, Rereleased int64
	// FailoverLost counts the conflicts (a fleet-wide grant, or its bind
	// that failed) over the row of a port handed to a child that an
	// asynchronous failover lost: nobody puts such a row back, and once
	// the grace period is over a fleet-wide grant may meet the port (the
	// child's lock keeps it from its host's processes). FailoverProbes
	// counts the bind probes that failed in such a time (the lock at
	// work). Documented; not violations. Every other conflict around a
	// failover is one: the grace period holds grants until the holders
	// have put their rows back.
	FailoverLost   int
	FailoverProbes int64
	// ReleaseProbes counts the failed probes (with the keys logged) of a
	// port whose last holder on the host was still releasing it: its row
	// was deleted, its lock not yet (the lock goes last). Not violations.
	ReleaseProbes int64
	GraceCalls    int // calls held up or refused by the grace period after a change of server (store.ErrGrace)
	// ProbeKeys says, for each failed bind probe whose key a worker
	// logged (with the server faults), the key and which claims held it.
	ProbeKeys       []string
	Errors          []string
	ReapedByWorkers int64
	// Violations describes the first maxViolations; ViolationCount counts all.
	Violations     []string
	ViolationCount int
	// CrossHost counts pairs of claims that would conflict on one host but
	// were held at once on two: allowed, and the proof that the hosts
	// shared the range.
	CrossHost int
	Latencies []time.Duration // of Allocate calls (granted or exhausted), sorted

	// Calls counts the workers' portalloc calls that returned; Timeouts,
	// those of them that gave up waiting. A timeout is not an error.
	Calls, Timeouts int
	// CallTimeout is the workers' call timeout, as the supervisor logged it;
	// zero when it did not, and then no hang is judged.
	CallTimeout               time.Duration
	ClockSteps, BigClockSteps int // steps of the wall clock; those of a second or more
	// Freezes counts workers stopped by SIGSTOP, FrozenKills those killed
	// while stopped; LongestFreeze is the longest a worker stayed stopped.
	Freezes, FrozenKills int
	LongestFreeze        time.Duration
	// GrantGap and CallGap are the longest times, while the workers ran, in
	// which no worker was granted a port, or completed any call.
	GrantGap, CallGap Gap
	// Slowest holds each worker's slowest call, slowest first. A call's
	// time leaves out the time its own worker was frozen during it: what
	// is left is waiting on the others.
	Slowest []Call
	// Overruns describes calls slower than Timeout plus HangMargin. Hangs
	// describes times no worker completed a call for that long, and
	// workers that did not stop when told to. Both fail a run.
	Overruns, Hangs []string
}

// Gap is a time in which something did not happen.
type Gap struct {
	Dur time.Duration
	At  time.Duration // when the gap began, since the run started
}

// Call is one portalloc call of a worker.
type Call struct {
	Proc    string
	Op      string
	Dur     time.Duration // less the time the worker itself was frozen
	Frozen  time.Duration // time the worker itself was frozen during the call
	At      time.Duration // when it returned, since the run started
	Timeout bool          // it gave up waiting
}

func (c Call) String() string {
	s := fmt.Sprintf("%s %s %v", c.Proc, c.Op, c.Dur.Round(time.Millisecond))
	if c.Frozen > 0 {
		s += fmt.Sprintf(" (+%v frozen itself)", c.Frozen.Round(time.Millisecond))
	}
	if c.Timeout {
		s += " timed out"
	}
	return s
}

// span is a time from start to end, monotonic nanoseconds.
type span struct{ start, end int64 }

// overlap is how long of [a, b] the spans cover.
func overlap(spans []span, a, b int64) time.Duration {
	var d int64
	for _, s := range spans {
		if lo, hi := max(a, s.start), min(b, s.end); hi > lo {
			d += hi - lo
		}
	}
	return time.Duration(d)
}

// Check reads every log under dir/logs and checks that no two claims that
// conflict under the address rule overlap in time on one host (a
// fleet-wide claim is on every host; a retirement ends every claim of its
// host, whose processes were killed before it), that every grant was
// bindable by its grantee, and that the workers kept completing calls
// (judged when the supervisor logged the call timeout). Events of all
// processes are ordered by their monotonic stamps, which clock steps do not
// move.
func Check(dir string) (Report, error) {
	var rep Report
	files, err := filepath.Glob(filepath.Join(dir, "logs", "*.jsonl"))
	if err != nil {
		return rep, err
	}
	var (
		byProc     = map[string][]Event{}
		kills      = map[string]int64{}
		dead       = map[string]int64{} // when killed workers were gone
		childExit  = map[string]int64{}
		childGone  = map[string]int64{} // when each child was reaped
		reaped     = map[string]int64{}
		retires    []Event
		failovers  []int64 // when the primary was killed, in asynchronous failovers
		rereleases []Event
		probeKeys  []Event // the keys of failed probes, where the workers logged them
		probes     []Event
		// From the supervisor's log, in its order.
		base, stop  int64 = math.MaxInt64, math.MaxInt64 // the run's start and end
		haveStart   bool
		frozenSince = map[string]int64{}
		frozen      = map[string][]span{} // each worker's frozen times
		calls       []Event
		releases    = map[string][]int64{} // when each worker's release calls returned
		callsOf     = map[string][]Event{} // each worker's calls, in its order
		grants      []int64
		failed      []bindFailure
	)
	unfreeze := func(proc string, t int64) {
		if since, ok := frozenSince[proc]; ok {
			frozen[proc] = append(frozen[proc], span{since, t})
			rep.LongestFreeze = max(rep.LongestFreeze, time.Duration(t-since))
			delete(frozenSince, proc)
		}
	}
	violate := func(format string, args ...any) {
		rep.ViolationCount++
		if len(rep.Violations) < maxViolations {
			rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
		}
	}
	counts := map[string]*int{KindClockStep: &rep.ClockSteps, KindFreeze: &rep.Freezes, KindCall: &rep.Calls,
		KindPressure: &rep.PressureSpells, KindShort: &rep.Shortages, KindKill: &rep.Kills, KindRetire: &rep.Retirements,
		KindLoseStore: &rep.StoreLosses, KindPGRestart: &rep.Restarts, KindFailover: &rep.Failovers, KindRepair: &rep.Repairs}
	for _, f := range files {
		evs, err := readLog(f)
		if err != nil {
			return rep, err
		}
		for _, e := range evs {
			if !haveStart {
				base = min(base, e.T)
			}
			if n := counts[e.Kind]; n != nil {
				*n++
			}
			switch e.Kind {
			case KindStart:
				base, haveStart = e.T, true
				rep.CallTimeout = time.Duration(e.DurNS)
			case KindStop:
				stop = e.T
			case KindClockStep:
				if d := time.Duration(e.DurNS); d >= time.Second || d <= -time.Second {
					rep.BigClockSteps++
				}
			case KindFreeze:
				frozenSince[e.Proc] = e.T
			case KindThaw:
				unfreeze(e.Proc, e.T)
			case KindStuck:
				rep.Hangs = append(rep.Hangs, fmt.Sprintf("%s (pid %d) had not stopped %v after it was told to", e.Proc, e.PID, time.Duration(e.DurNS)))
			case KindCall:
				calls = append(calls, e)
				callsOf[e.Proc] = append(callsOf[e.Proc], e)
				if e.Op == "release" {
					releases[e.Proc] = append(releases[e.Proc], e.T)
				}
				for _, c := range []struct {
					on bool
					n  *int
				}{{e.Timeout, &rep.Timeouts}, {e.Transient, &rep.Transients}, {e.Lost, &rep.LostCalls},
					{e.Unavailable, &rep.Unavailable}, {e.Grace, &rep.GraceCalls}} {
					if c.on {
						*c.n++
					}
				}
			case KindPressure, KindPressureEnd, KindPromoted, KindShort, KindLoseStore:
			case KindKill:
				if _, ok := frozenSince[e.Proc]; ok {
					rep.FrozenKills++
				}
				unfreeze(e.Proc, e.T)
				kills[e.Proc] = e.T
			case KindDead:
				dead[e.Proc] = e.T
			case KindRetire:
				retires = append(retires, e)
				rep.RetiredRows += e.Reaped
			case KindChildExit:
				childExit[e.Proc] = e.T
			case KindChildGone:
				childGone[e.Child] = e.T
			case KindPGRestart:
				rep.LongestRestart = max(rep.LongestRestart, time.Duration(e.DurNS))
			case KindFailover:
				if !e.Sync {
					failovers = append(failovers, e.T)
				}
			case KindRebuilt:
				rep.LongestFailover = max(rep.LongestFailover, time.Duration(e.DurNS))
			case KindRepair:
				rep.Restored += e.Restored
				rep.NotRestored += e.NotRestored
				rep.Rereleased += e.Rereleased
			case KindRerelease:
				rereleases = append(rereleases, e)
			case KindProbeKey:
				probeKeys = append(probeKeys, e)
			case KindChildBind:
				if e.Err != "" {
					rep.BindFailures++
					failed = append(failed, bindFailure{e, fmt.Sprintf("child %s (pid %d) could not bind %s %s:%d it was handed: %s", e.Proc, e.PID, e.Proto, e.Addr, e.Port, e.Err)})
				}
			default:
				byProc[e.Proc] = append(byProc[e.Proc], e)
			}
		}
	}

	var claims []*claim
	for proc, evs := range byProc {
		open := map[string]*claim{}
		leases := map[string]*claim{} // by holder
		for _, e := range evs {
			key := e.Proto + " " + e.Addr + " " + fmt.Sprint(e.Port)
			switch e.Kind {
			case KindGrant:
				a, err := netip.ParseAddr(e.Addr)
				if err != nil {
					return rep, fmt.Errorf("log of %s: %w", proc, err)
				}
				c := &claim{host: e.Host, fleet: e.Fleet, proto: e.Proto, addr: a, port: e.Port, proc: proc, pid: e.PID, start: e.T, end: math.MaxInt64,
					asked: e.T - e.DurNS}
				claims = append(claims, c)
				grants = append(grants, e.T)
				rep.Grants++
				if e.Holder != "" {
					c.holder, c.expiry = e.Holder, e.Since+e.TTLNS
					leases[e.Holder] = c
					rep.LeaseGrants++
					if e.Static {
						rep.LeaseReservations++
					}
					break
				}
				open[key] = c
				switch {
				case e.Fleet:
					rep.FleetGrants++
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
				if e.Fleet && e.Err == "" {
					rep.FleetBinds++
				}
				if e.EMFILE {
					rep.EMFILEBinds++ // no conflict: the worker was short of descriptors
					break
				}
				if e.Err != "" {
					rep.BindFailures++
					failed = append(failed, bindFailure{e, fmt.Sprintf("%s (pid %d) could not bind %s it was granted: %s", proc, e.PID, key, e.Err)})
				}
			case KindRenew:
				rep.Renewals++
				// A renewal extends only a lease that has not ended (see
				// statestore's RenewLease): the lease lasted all along.
				if c := leases[e.Holder]; c != nil {
					c.expiry = max(c.expiry, e.Since+e.TTLNS)
				}
			case KindLeaseDrop:
				rep.LeaseDrops++
				delete(leases, e.Holder)
			case KindLeaseEnded:
				rep.LeasesEnded++
				if c := leases[e.Holder]; c != nil {
					// The store read its lease clock at or before e.T and
					// found the lease ended; it was to last at least until
					// c.expiry.
					if e.T < c.expiry {
						violate("lease ended before its time: a renewal at %s found no lease of %s, granted or renewed to last until %s",
							stamp(e.T, base), c, stamp(c.expiry, base))
					}
					c.end = min(c.end, e.T)
					delete(leases, e.Holder)
				}
			case KindRelease:
				if e.Holder != "" {
					if c := leases[e.Holder]; c != nil {
						c.end = min(c.end, e.T)
						delete(leases, e.Holder)
						rep.LeaseReleases++
					}
					break
				}
				if c := open[key]; c != nil {
					c.end = e.T
					delete(open, key)
				}
			case KindTransfer:
				if c := open[key]; c != nil {
					c.child = e.Child
					delete(open, key)
				}
			case KindLeaseHeld:
				rep.LeaseRefusals++
			case KindProbe:
				rep.ProbeFailures += e.Probes
				probes = append(probes, e)
			case KindExhausted:
				if e.Fleet {
					rep.FleetExhausted++
					break
				}
				rep.Exhausted++
				rep.Latencies = append(rep.Latencies, time.Duration(e.DurNS))
			case KindError:
				rep.Errors = append(rep.Errors, fmt.Sprintf("%s (pid %d): %s", proc, e.PID, e.Err))
			case KindExit:
				reaped[proc] = max(reaped[proc], e.Reaped)
			}
		}
		// A killed worker's claims end when it was killed; its leases
		// stay until they run out.
		if t, ok := kills[proc]; ok {
			for _, c := range open {
				c.end = min(c.end, t)
			}
			for _, c := range leases {
				c.ofKilled = true
			}
		}
	}
	for _, c := range claims {
		if c.holder != "" && c.expiry < c.end {
			c.end = c.expiry
			rep.LeaseExpiries++
			if c.ofKilled {
				rep.KilledLeases++
			}
		}
		if c.child != "" {
			if t, ok := childExit[c.child]; ok {
				c.end = t
			}
		}
		// A retirement ends the claims of its host made before it: every
		// process there, children included, was killed first. A child
		// killed so logs no exit.
		for _, r := range retires {
			if !c.fleet && c.host == r.Host && c.start < r.T {
				c.end = min(c.end, r.T)
			}
		}
		for _, killed := range failovers {
			// A hand-off's claim granted before the primary was killed and
			// still held then: nobody puts its row back (see failWin).
			if c.child != "" && c.asked < killed && killed < c.end {
				c.failWin = append(c.failWin, span{killed, c.end})
			}
		}
		c.released = max(c.end, childGone[c.child]) // a child's lock goes when it is reaped
		if c.holder == "" && !c.fleet && c.child == "" && c.end != math.MaxInt64 {
			killed, wasKilled := kills[c.proc]
			rs := releases[c.proc]
			if i := slices.IndexFunc(rs, func(t int64) bool { return t >= c.end && (!wasKilled || t <= killed) }); i >= 0 {
				c.released = rs[i]
			} else if t, ok := dead[c.proc]; ok && wasKilled && c.end <= killed {
				// Its release never returned, or it was killed holding
				// it: the lock went with the process.
				c.released = t
			}
		}
	}
	rep.FailoverProbes = failoverProbes(probes, probeKeys, claims)
	rep.ReleaseProbes = releaseProbes(probeKeys, claims, callsOf)
	// A question about one key reads its claims, not the run's million.
	byKey := map[portKey][]*claim{}
	for _, c := range claims {
		k := portKey{c.proto, c.port}
		byKey[k] = append(byKey[k], c)
	}
	of := func(e Event) []*claim { return byKey[portKey{e.Proto, e.Port}] }
	for _, e := range probeKeys { // logged by the runs across hosts only
		rep.ProbeKeys = append(rep.ProbeKeys, strings.TrimSuffix(fmt.Sprintf("%s %s:%d on %s by %s at %s%s: %s", e.Proto, e.Addr, e.Port, e.Host, e.Proc, stamp(e.T, base), heldBy(of(e), e, base), e.Err), ": "))
	}
	for _, e := range rereleases {
		// The release the repair did again was of a claim of the
		// process's that had ended; one that is open now lost its row.
		for _, c := range of(e) {
			if c.proc == e.Proc && c.child == "" && c.holder == "" && c.proto == e.Proto && c.port == e.Port && c.addr.String() == e.Addr &&
				c.start < e.T && e.T < c.end {
				violate("%s released again by its own process's comparison with the store at %s while it held it (granted at %s): its row is gone, and the port can be granted to another process of its host",
					c, stamp(e.T, base), stamp(c.start, base))
			}
		}
	}
	for _, n := range reaped {
		rep.ReapedByWorkers += n
	}
	for proc, since := range frozenSince { // frozen to the end
		frozen[proc] = append(frozen[proc], span{since, math.MaxInt64})
	}
	for _, f := range failed {
		cs := of(f.e)
		if failoverLostBind(cs, f.e) {
			rep.FailoverLost++
			continue
		}
		violate("%s%s", f.msg, heldBy(cs, f.e, base))
	}
	rep.CrossHost = overlaps(byKey, violate, &rep, base)
	slices.Sort(rep.Latencies)
	progress(&rep, calls, grants, frozen, base, stop)
	return rep, nil
}

// progress judges whether the workers kept going: each worker's slowest
// call, calls that overran the timeout, and the longest times in which no
// worker was granted a port or completed any call. Only calls that
// returned before stop count; stop is the end of the run, or MaxInt64.
func progress(rep *Report, calls []Event, grants []int64, frozen map[string][]span, base, stop int64) {
	limit := rep.CallTimeout + HangMargin(rep.CallTimeout)
	slowest := map[string]Call{}
	var done []int64
	for _, e := range calls {
		if e.T > stop {
			continue // the workers' last releases, after the run
		}
		done = append(done, e.T)
		self := overlap(frozen[e.Proc], e.T-e.DurNS, e.T)
		c := Call{Proc: e.Proc, Op: e.Op, Dur: max(0, time.Duration(e.DurNS)-self), Frozen: self, At: time.Duration(e.T - base), Timeout: e.Timeout}
		if c.Dur > slowest[e.Proc].Dur || slowest[e.Proc].Proc == "" {
			slowest[e.Proc] = c
		}
		if rep.CallTimeout > 0 && c.Dur > limit {
			rep.Overruns = append(rep.Overruns, fmt.Sprintf("%s at %s: longer than the %v timeout plus %v", c, stamp(e.T, base), rep.CallTimeout, HangMargin(rep.CallTimeout)))
		}
	}
	rep.Slowest = slices.SortedFunc(maps.Values(slowest), func(a, b Call) int { return cmp.Compare(int64(b.Dur), int64(a.Dur)) })
	rep.GrantGap = longestGap(grants, base, stop)
	rep.CallGap = longestGap(done, base, stop)
	if rep.CallTimeout > 0 && rep.CallGap.Dur > limit {
		rep.Hangs = append(rep.Hangs, fmt.Sprintf("no worker completed a call for %v from %s: longer than the %v timeout plus %v",
			rep.CallGap.Dur.Round(time.Millisecond), stamp(base+int64(rep.CallGap.At), base), rep.CallTimeout, HangMargin(rep.CallTimeout)))
	}
}

// longestGap is the longest time between two of ts, or between the last
// and stop (unless stop is MaxInt64); times after stop do not count, nor
// does the time before the first one, when the workers open the store.
func longestGap(ts []int64, base, stop int64) Gap {
	ts = slices.DeleteFunc(ts, func(t int64) bool { return t > stop })
	slices.Sort(ts)
	var g Gap
	for i := 1; i < len(ts); i++ {
		if d := time.Duration(ts[i] - ts[i-1]); d > g.Dur {
			g = Gap{Dur: d, At: time.Duration(ts[i-1] - base)}
		}
	}
	if n := len(ts); n > 0 && stop != math.MaxInt64 {
		if d := time.Duration(stop - ts[n-1]); d > g.Dur {
			g = Gap{Dur: d, At: time.Duration(ts[n-1] - base)}
		}
	}
	return g
}

// bindFailure is a grant its grantee could not bind, and what to say.
type bindFailure struct {
	e   Event
	msg string
}

// heldBy says which claims of other processes of the run conflicted with
// the failed bind e when it failed, or that none did: then a process
// outside the run held the port (another run on the same range, a
// program that binds ports of its own), or a bind probe of a worker was
// holding it for that instant.
func heldBy(claims []*claim, e Event, base int64) string {
	a, err := netip.ParseAddr(e.Addr)
	if err != nil {
		return ""
	}
	var by []string
	var last *claim // the conflicting claim that ended last before e
	for _, c := range claims {
		if (c.host != e.Host && !c.fleet) || c.proto != e.Proto || c.port != e.Port || !netaddr.Conflicts(a, c.addr) {
			continue
		}
		if c.proc != e.Proc && c.child != e.Proc && c.start <= e.T && e.T < c.end {
			by = append(by, fmt.Sprintf("%s from %s", c, stamp(c.start, base)))
		} else if c.end <= e.T && (last == nil || c.end > last.end) {
			last = c
		}
	}
	switch {
	case len(by) > 0:
		return " (held by " + strings.Join(by, ", ") + ")"
	case last == nil:
		return " (no other claim of this run held it: a process outside the run, or a worker's bind probe, did)"
	}
	return fmt.Sprintf(" (no other claim of this run held it; the last before it: %s from %s until %s, released or gone at %s)",
		last, stamp(last.start, base), stamp(last.end, base), stamp(max(last.released, last.end), base))
}

// overlaps reports a violation for every two claims of one host, protocol
// and port whose addresses conflict and whose times overlap, and returns
// how many such pairs were of two hosts. A fleet-wide claim is on every
// host. A conflict in a claim's failover window is counted in rep, as
// FailoverLost, not as a violation.
func overlaps(groups map[portKey][]*claim, violate func(string, ...any), rep *Report, base int64) (crossHost int) {
	for _, g := range groups {
		g = slices.Clone(g)
		slices.SortFunc(g, func(a, b *claim) int { return cmp.Compare(a.start, b.start) })
		for i, a := range g {
			for _, b := range g[i+1:] {
				if b.start >= a.end {
					break
				}
				switch {
				case !netaddr.Conflicts(a.addr, b.addr):
				case a.host != b.host && !a.fleet && !b.fleet:
					crossHost++
				case inFailoverWindow(a, b) || inFailoverWindow(b, a):
					rep.FailoverLost++
				default:
					violate("double grant: %s from %s until %s overlaps %s from %s", a, stamp(a.start, base), stamp(a.end, base), b, stamp(b.start, base))
				}
			}
		}
	}
	return crossHost
}

// portKey is a protocol and a port: the claims that can conflict.
type portKey struct {
	proto string
	port  uint16
}

// stamp shows a monotonic time as the time since the run started (base): the wall clock
// may have been anywhere.
func stamp(t, base int64) string {
	if t == math.MaxInt64 {
		return "the end"
	}
	return fmt.Sprintf("+%.6fs", time.Duration(t-base).Seconds())
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
		// A SIGKILL can cut the last line short; anything else is not ours.
		var e Event
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			evs = append(evs, e)
		}
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

// inFailoverWindow reports whether b, a fleet-wide claim, began in a's failWin: the
// child's lock keeps the port from its own host only.
func inFailoverWindow(a, b *claim) bool { return b.fleet && inSpans(a.failWin, b.start) }

func inSpans(spans []span, t int64) bool {
	for _, w := range spans {
		if w.start <= t && t <= w.end {
			return true
		}
	}
	return false
}

// failoverLostBind reports whether the failed bind e is a conflict over
// a row an asynchronous failover lost: the grant e bound (its own claim)
// and a claim of another process that held the key when it failed, one
// of them begun while the other's row may have been missing.
func failoverLostBind(claims []*claim, e Event) bool {
	a, err := netip.ParseAddr(e.Addr)
	if err != nil {
		return false
	}
	var own *claim
	for _, c := range claims {
		if (c.proc == e.Proc || c.child == e.Proc) && c.proto == e.Proto && c.port == e.Port && c.start <= e.T && (own == nil || c.start > own.start) {
			own = c
		}
	}
	if own == nil {
		return false
	}
	for _, c := range claims {
		if c == own || (c.host != e.Host && !c.fleet) || c.proto != e.Proto || c.port != e.Port || c.start > e.T || c.end <= e.T ||
			!netaddr.Conflicts(a, c.addr) {
			continue
		}
		if inFailoverWindow(c, own) || inFailoverWindow(own, c) {
			return true
		}
	}
	return false
}

// releaseProbes counts the failed probes, among those whose keys the
// workers logged, of a key that a claim of the prober's host was
// releasing: between the release's log (the claim's end) and the return of
// its call, the death of its killed worker, or the reaping of its child
// (see claim.released). A probe happened within the prober's call
// that logged it, before the log: from the start of its call (calls, by
// process) to the log.
func releaseProbes(keys []Event, claims []*claim, calls map[string][]Event) int64 {
	var n int64
	for _, k := range keys {
		a, err := netip.ParseAddr(k.Addr)
		if err != nil {
			continue
		}
		from := k.T
		if i, _ := slices.BinarySearchFunc(calls[k.Proc], k.T, func(e Event, t int64) int { return cmp.Compare(e.T, t) }); i < len(calls[k.Proc]) {
			c := calls[k.Proc][i]
			from = min(from, c.T-c.DurNS)
		}
		for _, c := range claims {
			if c.host == k.Host && c.proto == k.Proto && c.port == k.Port && c.end <= k.T && from <= c.released && netaddr.Conflicts(a, c.addr) {
				n++
				break
			}
		}
	}
	return n
}

// failoverProbes counts the failed bind probes that came while a claim
// on the prober's host may have been missing from the store after an
// asynchronous failover: the store let the worker claim a port whose
// holder had not put its row back yet, and berth's probe kept it from
// being granted. Where the workers logged the probes' keys (keys), a
// probe counts only if such a claim conflicts with its key; else any
// claim of the host in its window will do.
func failoverProbes(probes, keys []Event, all []*claim) int64 {
	claims := slices.DeleteFunc(slices.Clone(all), func(c *claim) bool { return len(c.failWin) == 0 }) // none without failovers
	var n int64
	if len(claims) == 0 {
		return 0
	}
	if len(keys) > 0 {
		probes = slices.Clone(keys)
		for i := range probes {
			probes[i].Probes = 1 // each key is one probe
		}
	}
	for _, p := range probes {
		a, err := netip.ParseAddr(p.Addr)
		if len(keys) > 0 && err != nil {
			continue
		}
		for _, c := range claims {
			if inSpans(c.failWin, p.T) && (c.fleet || c.host == p.Host) &&
				(len(keys) == 0 || c.proto == p.Proto && c.port == p.Port && netaddr.Conflicts(a, c.addr)) {
				n += p.Probes
				break
			}
		}
	}
	return n
}
