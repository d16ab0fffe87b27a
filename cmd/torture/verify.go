package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
)

// Summary is the outcome of a run.
type Summary struct {
	Config
	Report
	Elapsed time.Duration
	// ReapedAtEnd is how many rows the final Reap deleted.
	ReapedAtEnd int
	// LeftBehind are rows of dead processes found after Reap.
	LeftBehind []string
}

// OK reports whether the run proved every invariant, without an
// unexpected error on the way.
func (s Summary) OK() bool {
	return s.ViolationCount == 0 && len(s.LeftBehind) == 0 && len(s.Errors) == 0 && s.Grants > 0 &&
		len(s.Hangs) == 0 && len(s.Overruns) == 0
}

// verify judges the run that started at start, whose workers drive left
// running: it checks that no row of a killed worker survived a Reap,
// stops the workers, has Check prove the invariants from the logs, and
// checks that a Reap then empties the store.
func (s *supervisor) verify(ctx context.Context, start time.Time) (Summary, error) {
	sum := Summary{Config: s.cfg}
	// While the last workers still run: no row of a killed one may survive a Reap.
	left, err := s.checkStore(ctx, false)
	if err != nil {
		s.stopAll()
		return Summary{}, err
	}
	sum.LeftBehind = append(sum.LeftBehind, left...)
	s.stopAll()
	sum.Elapsed = time.Since(start)

	rep, err := Check(s.cfg.Dir)
	if err != nil {
		return Summary{}, err
	}
	if n := rep.ProbeFailures - rep.FailoverProbes - rep.ReleaseProbes; s.cfg.Hosts > 0 && n > 0 {
		// In namespaces of the run's own only the run binds and locks:
		// the store let a worker claim a port that a holder it knew of
		// had bound or locked.
		rep.ViolationCount++
		rep.Violations = append(rep.Violations, fmt.Sprintf("%d bind probes failed: the store let workers claim ports a holder had bound (berth's probe kept them from being granted)", n))
		for _, k := range first(rep.ProbeKeys, 10) {
			rep.Violations = append(rep.Violations, "  probe failed: "+k)
		}
	}
	sum.Report = rep
	// The workers have gone and their children (which outlive killed
	// workers by design) end within a quarter second: after a Reap the
	// table must then be empty.
	deadline := time.Now().Add(15 * time.Second)
	for {
		left, err = s.checkStore(ctx, true)
		if err != nil {
			return Summary{}, err
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sum.LeftBehind = append(sum.LeftBehind, left...)
	sum.ReapedAtEnd = s.reapedAtEnd
	return sum, nil
}

// checkStore reaps and lists the table, of every host with a Store. It
// returns the rows owned by killed workers (which must have been reaped);
// with all set, every row left counts, since no process of the run is
// alive.
func (s *supervisor) checkStore(ctx context.Context, all bool) (left []string, err error) {
	if all {
		s.reapedAtEnd = 0
	}
	for h := range max(1, len(s.hosts)) {
		var st store.Store
		where := ""
		if s.cfg.Store != "" {
			cfg := portalloc.Config{StoreDSN: s.cfg.Store, Host: hostName(h), Timeout: s.cfg.Timeout}
			where = " on " + cfg.Host
			st, err = fleet.Open(ctx, cfg)
		} else {
			st, err = statestore.Open(ctx, filepath.Join(s.cfg.Dir, "state", "berth.db"), statestore.Options{SweepInterval: -1})
		}
		if err != nil {
			return nil, err
		}
		n, err := st.Reap(ctx)
		var rows []store.Reservation
		if err == nil {
			rows, err = st.List(ctx, store.Filter{})
		}
		_ = st.Close()
		if err != nil {
			return nil, err
		}
		if all {
			s.reapedAtEnd += n
		}
		for _, r := range rows {
			if all || slices.ContainsFunc(s.killed, func(k killedWorker) bool { return k.host == h && r.Owner.Same(k.owner) }) {
				left = append(left, fmt.Sprintf("%s of pid %d%s left after Reap", r.Key, r.Owner.PID, where))
			}
		}
	}
	return left, nil
}

// Print writes the summary for people.
func (s Summary) Print(w io.Writer) {
	secs := s.Elapsed.Seconds()
	var modes string
	for _, m := range []struct {
		on   bool
		name string
	}{
		{s.ClockStep, ", clock stepping"}, {s.Freeze, ", freezing"}, {s.LoseStore > 0, fmt.Sprintf(", store lost every %v", s.LoseStore)},
		{s.Leases, ", leases"}, {s.FDPressure, ", descriptor pressure"},
		{s.PGRestartEvery > 0, fmt.Sprintf(", server restarted every %v", s.PGRestartEvery)},
		{s.FailoverEvery > 0 && s.SyncStandby, fmt.Sprintf(", failover to an synchronous standby every %v", s.FailoverEvery)},
		{s.FailoverEvery > 0 && !s.SyncStandby, fmt.Sprintf(", failover to an asynchronous standby every %v (%s)", s.FailoverEvery, s.FailoverKind)},
	} {
		if m.on {
			modes += m.name
		}
	}
	workers := fmt.Sprintf("%d workers", s.Workers)
	switch {
	case s.Hosts > 0:
		workers = fmt.Sprintf("%d hosts of %d workers on PostgreSQL", s.Hosts, s.Workers)
	case s.Store != "":
		workers += " on PostgreSQL"
	}
	fmt.Fprintf(w, "berth torture: %s, %v, range %s (%d ports), kill every %v, timeout %v%s, seed %d\n",
		workers, s.Duration, s.Range, s.Range.Size(), s.KillEvery, s.Timeout, modes, s.Seed)
	fleet := ""
	if s.FleetWorkers > 0 {
		fleet = fmt.Sprintf(", %d fleet-wide", s.FleetGrants)
	}
	fmt.Fprintf(w, "grants          %d (%.0f/s): %d allocated, %d reserved, %d handed to children%s\n",
		s.Grants, float64(s.Grants)/secs, s.Allocations, s.Reservations, s.Handoffs, fleet)
	line := func(on bool, format string, args ...any) {
		if on {
			fmt.Fprintf(w, format+"\n", args...)
		}
	}
	line(true, "range exhausted %d times", s.Exhausted)
	line(true, "kills           %d", s.Kills)
	line(s.RetireEvery > 0, "retirements     %d every %v (every process of the host killed first), %d rows deleted",
		s.Retirements, s.RetireEvery, s.RetiredRows)
	line(s.FleetWorkers > 0, "fleet-wide      %d grants to %d fleet workers, %d binds (each grant on all %d hosts), band exhausted %d times; hosts' workers refused a fleet-wide port %d times",
		s.FleetGrants, s.FleetWorkers, s.FleetBinds, s.Hosts, s.FleetExhausted, s.LeaseRefusals)
	line(s.ClockStep, "clock steps     %d (%d of %v either way, %d across a second boundary); true time set back",
		s.ClockSteps, s.BigClockSteps, bigStep, s.ClockSteps-s.BigClockSteps)
	line(s.Freeze, "freezes         %d (%d killed while frozen), longest %v", s.Freezes, s.FrozenKills, s.LongestFreeze.Round(time.Millisecond))
	line(s.LoseStore > 0, "store losses    %d (directory removed, file replaced or truncated); %d calls failed on a store lost under them", s.StoreLosses, s.LostCalls)
	line(s.Leases, "leases          %d granted (%d reserved), %d renewals, %d released, %d ran out (%d dropped by their worker, %d of killed workers), %d found ended on renewal",
		s.LeaseGrants, s.LeaseReservations, s.Renewals, s.LeaseReleases, s.LeaseExpiries, s.LeaseDrops, s.KilledLeases, s.LeasesEnded)
	line(s.FDPressure, "fd pressure     %d spells; %d calls failed with ErrTransient, %d binds refused with EMFILE (bound again after the spell), %d children not started for want of descriptors",
		s.PressureSpells, s.Transients, s.EMFILEBinds, s.Shortages)
	faults := s.PGRestartEvery > 0 || s.FailoverEvery > 0
	line(s.PGRestartEvery > 0, "server restarts %d (pg_ctl restart -m fast), longest %v", s.Restarts, s.LongestRestart.Round(time.Millisecond))
	line(s.FailoverEvery > 0, "failovers       %d (primary SIGKILLed, standby promoted, new standby built), longest %v", s.Failovers, s.LongestFailover.Round(time.Millisecond))
	line(faults, "repairs         %d comparisons with the store: %d rows put back, %d not (another process had the port), %d releases done again; %d calls failed on an unreachable server",
		s.Repairs, s.Restored, s.NotRestored, s.Rereleased, s.Unavailable)
	line(faults, "grace periods   %d calls held up or refused while the holders put their rows back after a change of server", s.GraceCalls)
	line(s.FailoverEvery > 0 && !s.SyncStandby, "failover losses %d conflicts and %d bind probes over the rows of ports handed to children that an asynchronous failover lost: nobody puts those back, and their locks keep them from their host alone (documented; not violations)",
		s.FailoverLost, s.FailoverProbes)
	line(true, "calls           %d returned, %d timed out", s.Calls, s.Timeouts)
	fmt.Fprintf(w, "longest gaps    %v without a grant (from +%.3fs), %v without a call returning (from +%.3fs); a hang is over %v\n",
		s.GrantGap.Dur.Round(time.Millisecond), s.GrantGap.At.Seconds(), s.CallGap.Dur.Round(time.Millisecond), s.CallGap.At.Seconds(),
		s.Timeout+HangMargin(s.Timeout))
	if n := len(s.Slowest); n > 0 {
		fmt.Fprintf(w, "slowest calls   each worker's slowest, of %d workers: median %v\n", n, s.Slowest[n/2].Dur.Round(time.Millisecond))
		for _, c := range s.Slowest[:min(n, 8)] {
			fmt.Fprintf(w, "  %s at +%.3fs\n", c, c.At.Seconds())
		}
	}
	line(true, "rows reaped     %d by workers, %d by the final reap", s.ReapedByWorkers, s.ReapedAtEnd)
	line(true, "bind failures   %d", s.BindFailures)
	line(true, "probe failures  %d", s.ProbeFailures)
	line(s.Hosts > 1, "shared ports    %d times two hosts held one key at once (allowed: ports are per host)", s.CrossHost)
	if n := len(s.Latencies); n > 0 {
		fmt.Fprintf(w, "allocate        p50 %v  p99 %v  max %v  (n=%d)\n",
			Percentile(s.Latencies, 50).Round(time.Microsecond), Percentile(s.Latencies, 99).Round(time.Microsecond),
			s.Latencies[n-1].Round(time.Microsecond), n)
	}
	for _, l := range []struct {
		name string
		n    int
		xs   []string
	}{
		{"errors", len(s.Errors), first(s.Errors, 10)}, {"left behind", len(s.LeftBehind), first(s.LeftBehind, 10)},
		{"hangs", len(s.Hangs), first(s.Hangs, 10)}, {"overruns", len(s.Overruns), first(s.Overruns, 10)},
		{"violations", s.ViolationCount, first(s.Violations, 20)},
	} {
		fmt.Fprintf(w, "%-15s %d\n", l.name, l.n)
		for _, x := range l.xs {
			fmt.Fprintf(w, "  %s\n", x)
		}
	}
}

func first(xs []string, n int) []string { return xs[:min(len(xs), n)] }
