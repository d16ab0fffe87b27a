package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-go/berth/store"

	"github.com/berth-go/berth/internal/netns"
)

type supervisor struct {
	cfg         Config
	log         *eventLog
	rng         *rand.Rand
	clock       *clockStepper // nil unless cfg.ClockStep
	hosts       []netns.NS    // the fleet's hosts with Hosts; none without
	pg          *ownServer    // the run's own server; nil without
	workers     []*workerProc
	frozen      []frozenWorker // workers stopped by SIGSTOP, a subset of workers
	started     int            // workers started, for their names
	killed      []killedWorker // identities of the workers killed
	reapedAtEnd int
	faults      int // server restarts and failovers so far
}

type workerProc struct {
	cmd   *exec.Cmd
	stdin io.Closer
	name  string
	host  int // index in supervisor.hosts; fleetHost for a fleet worker
}

// fleetHost is the host index of a fleet worker, which runs on no host.
const fleetHost = -1

// killedWorker is a worker the supervisor killed: its identity (pid and start time, since
// the pid will be reused), to find its rows after a Reap.
type killedWorker struct {
	owner store.Owner
	host  int
}

// frozenWorker is a worker stopped until a time.
type frozenWorker struct {
	w     *workerProc
	until time.Time
}

// drive starts the workers, brings the weather of s.cfg until the
// deadline (see loop), and ends it (see endLoop). On an error it stops
// the workers; otherwise they are still running, for verify to find the
// rows of the killed ones reaped while the others live.
func (s *supervisor) drive(ctx context.Context, deadline time.Time) error {
	s.log.add(Event{Kind: KindStart, DurNS: int64(s.cfg.Timeout)})
	var on []int // the host of each worker to start
	for h := range max(1, len(s.hosts)) {
		on = append(on, slices.Repeat([]int{h}, s.cfg.Workers)...)
	}
	on = append(on, slices.Repeat([]int{fleetHost}, s.cfg.FleetWorkers)...)
	var err error
	for _, h := range on {
		if err = s.start(h); err != nil {
			break
		}
	}
	if err == nil {
		err = s.loop(ctx, deadline)
		if endErr := s.endLoop(); err == nil {
			err = endErr
		}
	}
	if err != nil {
		s.stopAll()
	}
	return err
}

// start starts a worker on the host of index h (0 without hosts), or a
// fleet worker (h is fleetHost) in this process's namespace.
func (s *supervisor) start(h int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	s.started++
	name := fmt.Sprintf("w%d", s.started)
	role := "worker"
	cmd := exec.Command(self)
	if len(s.hosts) > 0 && h != fleetHost {
		cmd = s.hosts[h].Command(self)
	}
	if h == fleetHost {
		role, name = "fleet", fmt.Sprintf("f%d", s.started)
	}
	cmd.Env = append(os.Environ(), envRole+"="+role, envDir+"="+s.cfg.Dir, envProc+"="+name,
		envRange+"="+s.cfg.Range.String(), envSeed+"="+strconv.FormatUint(s.rng.Uint64(), 10),
		envTimeout+"="+s.cfg.Timeout.String(),
		// Under -race a child would hold its lock a second past its exit.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	if s.cfg.Leases && h != fleetHost {
		cmd.Env = append(cmd.Env, envLeases+"=1")
	}
	if s.cfg.FDPressure && h != fleetHost {
		cmd.Env = append(cmd.Env, envFDs+"=1")
	}
	if s.pg != nil && (s.cfg.PGRestartEvery > 0 || s.cfg.FailoverEvery > 0) {
		cmd.Env = append(cmd.Env, envFaults+"=1")
	}
	switch {
	case h == fleetHost:
		names := make([]string, len(s.hosts))
		for i, ns := range s.hosts {
			names[i] = ns.Name
		}
		cmd.Env = append(cmd.Env, envStore+"="+s.cfg.Store, envNetns+"="+strings.Join(names, ","))
	case s.cfg.Store != "":
		cmd.Env = append(cmd.Env, envStore+"="+s.cfg.Store, envHost+"="+hostName(h))
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("torture: start worker: %w", err)
	}
	s.workers = append(s.workers, &workerProc{cmd: cmd, stdin: stdin, name: name, host: h})
	return nil
}

// loop, until the deadline: kills a random worker every KillEvery and
// starts a replacement; steps the clock every 1-2 s (ClockStep); freezes a
// random worker about every second, and thaws or kills the frozen ones
// when their time is up (Freeze); and brings the other faults of s.cfg.
// Every time here is read from Go's monotonic clock, which the steps do
// not move.
func (s *supervisor) loop(ctx context.Context, deadline time.Time) error {
	every := func(d time.Duration) func() time.Duration { return func() time.Duration { return d } }
	rnd := func(from time.Duration) func() time.Duration {
		return func() time.Duration { return from + time.Duration(s.rng.IntN(1000))*time.Millisecond }
	}
	// In the order they are brought when due at once. The next of each is
	// due a gap after this one was due; kills keep their cadence; a
	// restart or a failover, which takes seconds, counts its gap from its
	// end.
	type fault struct {
		on      bool
		gap     func() time.Duration
		do      func(now time.Time) error
		cadence bool
		fromEnd bool
		next    time.Time // zero: never
	}
	faults := []*fault{
		{on: s.cfg.KillEvery > 0, gap: every(s.cfg.KillEvery), cadence: true,
			do: func(time.Time) error { return s.kill(ctx, s.workers[s.rng.IntN(len(s.workers))], true) }},
		{on: s.cfg.RetireEvery > 0, gap: every(s.cfg.RetireEvery), do: func(time.Time) error { return s.retire(ctx) }},
		{on: s.clock != nil, gap: rnd(time.Second), do: func(time.Time) error { return s.stepClock() }},
		{on: s.cfg.Freeze, gap: rnd(500 * time.Millisecond), do: s.freezeOne},
		{on: s.cfg.PGRestartEvery > 0, gap: every(s.cfg.PGRestartEvery), fromEnd: true,
			do: func(time.Time) error { return s.restartServer(ctx) }},
		{on: s.cfg.FailoverEvery > 0, gap: every(s.cfg.FailoverEvery), fromEnd: true,
			do: func(time.Time) error { return s.failover(ctx) }},
		{on: s.cfg.LoseStore > 0, gap: every(s.cfg.LoseStore), do: func(time.Time) error { return s.loseStore() }},
	}
	now := time.Now()
	for _, f := range faults {
		if f.on {
			f.next = now.Add(f.gap())
		}
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		due := deadline
		if s.faults < s.cfg.Faults {
			// Past the deadline until the faults asked for are done.
			due = time.Now().Add(time.Hour)
		}
		for _, f := range faults {
			if !f.next.IsZero() && f.next.Before(due) {
				due = f.next
			}
		}
		for _, f := range s.frozen {
			if f.until.Before(due) {
				due = f.until
			}
		}
		timer.Reset(time.Until(due))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		now := time.Now()
		if !now.Before(deadline) && s.faults >= s.cfg.Faults {
			return nil
		}
		if err := s.thawDue(ctx, now); err != nil {
			return err
		}
		for _, f := range faults {
			if f.next.IsZero() || now.Before(f.next) {
				continue
			}
			switch {
			case f.cadence:
				for !f.next.After(now) {
					f.next = f.next.Add(f.gap())
				}
			case !f.fromEnd:
				f.next = now.Add(f.gap())
			}
			if err := f.do(now); err != nil {
				return err
			}
			if f.fromEnd {
				f.next = time.Now().Add(f.gap())
			}
		}
	}
}

// The ways loseStore loses the store.
var losses = []struct {
	name string
	lose func(dir string) error
}{
	{"removed the state directory", func(dir string) error {
		// Workers make the directory again as it goes: try a few times.
		var err error
		for range 10 {
			if err = os.RemoveAll(dir); err == nil {
				return nil
			}
		}
		return err
	}},
	{"replaced the database with an empty file", func(dir string) error {
		db := filepath.Join(dir, "berth.db")
		if err := os.Remove(db); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.WriteFile(db, nil, 0o600); !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil // the directory was lost already, and not made again yet
	}},
	{"truncated the database", func(dir string) error {
		err := os.Truncate(filepath.Join(dir, "berth.db"), 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil // lost already, and not made again yet
		}
		return err
	}},
}

func (s *supervisor) loseStore() error {
	l := losses[s.rng.IntN(len(losses))]
	if err := l.lose(filepath.Join(s.cfg.Dir, "state")); err != nil {
		return fmt.Errorf("torture: lose the store: %w", err)
	}
	s.log.add(Event{Kind: KindLoseStore, Op: l.name})
	say(s.cfg.Progress, "%s", l.name)
	return nil
}

// kill SIGKILLs w, frozen or not, waits for it, and with replace starts
// a replacement on the host it was on.
func (s *supervisor) kill(ctx context.Context, w *workerProc, replace bool) error {
	pid := w.cmd.Process.Pid
	id, idErr := store.LookupOwner(ctx, pid)
	// Logged before the signal: the victim's claims end no later.
	s.log.add(Event{Kind: KindKill, Proc: w.name, PID: pid})
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("torture: kill %s (pid %d): %w", w.name, pid, err)
	}
	_ = w.cmd.Wait()
	s.log.add(Event{Kind: KindDead, Proc: w.name, PID: pid})
	if idErr == nil {
		s.killed = append(s.killed, killedWorker{owner: id, host: w.host})
	}
	_ = w.stdin.Close()
	s.workers = slices.DeleteFunc(s.workers, func(x *workerProc) bool { return x == w })
	wasFrozen := len(s.frozen)
	s.frozen = slices.DeleteFunc(s.frozen, func(f frozenWorker) bool { return f.w == w })
	how := "killed worker"
	if len(s.frozen) < wasFrozen {
		how = "killed frozen worker"
	}
	say(s.cfg.Progress, "%s %s (pid %d)", how, w.name, pid)
	if replace {
		return s.start(w.host)
	}
	return nil
}

// retire takes a random host down and brings it back: it SIGKILLs the
// host's workers, then every other process in its namespace (their
// children), retires it from another random host through
// pgstore.Store.Retire, logs the retirement, and starts fresh workers
// there. The fleet workers, whose sockets on the host live in
// namespaces of their own processes, go on: their fleet-wide rows are no
// host's, and retirement leaves them.
func (s *supervisor) retire(ctx context.Context) error {
	v := s.rng.IntN(len(s.hosts))
	by := (v + 1 + s.rng.IntN(len(s.hosts)-1)) % len(s.hosts)
	for _, w := range slices.Clone(s.workers) {
		if w.host == v {
			if err := s.kill(ctx, w, false); err != nil {
				return err
			}
		}
	}
	// Only the workers' children are left there; the fleet workers, never
	// in a host's namespace but for the instant of a bind, are spared.
	fleet := map[int]bool{}
	for _, w := range s.workers {
		if w.host == fleetHost {
			fleet[w.cmd.Process.Pid] = true
		}
	}
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.hosts[v].KillAll(kctx, func(pid int) bool { return fleet[pid] }); err != nil {
		return fmt.Errorf("torture: take %s down: %w", hostName(v), err)
	}
	n, err := retireHost(ctx, s.cfg.Store, hostName(by), hostName(v), s.cfg.Timeout)
	for deadline := time.Now().Add(30 * time.Second); err != nil && s.pg != nil && unavailable(err) && time.Now().Before(deadline); {
		// A connection that died with a restart or a failover: try again.
		time.Sleep(50 * time.Millisecond)
		n, err = retireHost(ctx, s.cfg.Store, hostName(by), hostName(v), s.cfg.Timeout)
	}
	if errors.Is(err, store.ErrNotFound) {
		n, err = 0, nil // every worker of the host was killed before it reached the store
	}
	if err != nil {
		return err
	}
	s.log.add(Event{Kind: KindRetire, Host: hostName(v), Reaped: int64(n)})
	say(s.cfg.Progress, "retired %s from %s: %d rows deleted", hostName(v), hostName(by), n)
	for range s.cfg.Workers {
		if err := s.start(v); err != nil {
			return err
		}
	}
	return nil
}

// ErrNeedsRoot is wrapped by Run's error when Config.ClockStep is set and
// the process may not set the system clock.
var ErrNeedsRoot = errors.New("stepping the system clock needs root (CAP_SYS_TIME); run as root, or turn clock stepping off")

// bigStep is the large clock step, either way: far beyond any tolerance
// for clock readings that differ by a tick.
const bigStep = 300 * time.Second

// nextStep picks the next step of the wall clock, given how far it is off
// the true time and the fraction of a second it shows: half the time
// bigStep forward or back (back towards the true time once it is bigStep
// off, so the clock never wanders further), otherwise 0.5-0.9 s in a
// direction that crosses a second boundary, which changes every reading
// truncated to whole seconds (as /proc/stat's btime is).
func nextStep(rng *rand.Rand, offset, frac time.Duration) time.Duration {
	if rng.IntN(2) == 0 {
		switch {
		case offset >= bigStep:
			return -bigStep
		case offset <= -bigStep:
			return bigStep
		case rng.IntN(2) == 0:
			return bigStep
		default:
			return -bigStep
		}
	}
	m := 500*time.Millisecond + time.Duration(rng.IntN(400))*time.Millisecond
	up := frac+m >= time.Second // forward into the next second
	down := frac < m            // back into the previous one
	// m >= 0.5 s: when up fails, frac < 1 s - m <= m, so down holds.
	if up && (!down || rng.IntN(2) == 0) {
		return m
	}
	return -m
}

func (s *supervisor) stepClock() error {
	d, err := s.clock.step(func(offset, frac time.Duration) time.Duration {
		return nextStep(s.rng, offset, frac)
	})
	if err != nil {
		return err
	}
	s.log.add(Event{Kind: KindClockStep, DurNS: int64(d)})
	say(s.cfg.Progress, "stepped the clock by %v", d)
	return nil
}

// freezeOne stops a random running worker for 100 ms to 3 s, unless half
// the workers are frozen already: the others must be able to go on.
func (s *supervisor) freezeOne(now time.Time) error {
	if len(s.frozen) >= max(1, len(s.workers)/2) {
		return nil
	}
	running := slices.DeleteFunc(slices.Clone(s.workers), func(w *workerProc) bool {
		return slices.ContainsFunc(s.frozen, func(f frozenWorker) bool { return f.w == w })
	})
	w := running[s.rng.IntN(len(running))]
	d := 100*time.Millisecond + time.Duration(s.rng.IntN(2900))*time.Millisecond
	pid := w.cmd.Process.Pid
	// Logged before the signal: the frozen time it starts covers the stop.
	s.log.add(Event{Kind: KindFreeze, Proc: w.name, PID: pid, DurNS: int64(d)})
	if err := freeze(w.cmd.Process); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			// It exited on its own (and logged why); a kill replaces it.
			s.log.add(Event{Kind: KindThaw, Proc: w.name, PID: pid, Err: err.Error()})
			return nil
		}
		return fmt.Errorf("torture: freeze %s (pid %d): %w", w.name, pid, err)
	}
	s.frozen = append(s.frozen, frozenWorker{w: w, until: now.Add(d)})
	say(s.cfg.Progress, "froze worker %s (pid %d) for %v", w.name, pid, d)
	return nil
}

// thawDue lets go of the workers whose frozen time is up, killing one in
// four instead.
func (s *supervisor) thawDue(ctx context.Context, now time.Time) error {
	for _, f := range slices.Clone(s.frozen) {
		if now.Before(f.until) {
			continue
		}
		var err error
		if s.rng.IntN(4) == 0 {
			err = s.kill(ctx, f.w, true)
		} else {
			err = s.thaw(f.w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *supervisor) thaw(w *workerProc) error {
	s.frozen = slices.DeleteFunc(s.frozen, func(f frozenWorker) bool { return f.w == w })
	pid := w.cmd.Process.Pid
	if err := thaw(w.cmd.Process); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("torture: thaw %s (pid %d): %w", w.name, pid, err)
	}
	// Logged after the signal: the frozen time it ends covers the stop.
	s.log.add(Event{Kind: KindThaw, Proc: w.name, PID: pid})
	say(s.cfg.Progress, "thawed worker %s (pid %d)", w.name, pid)
	return nil
}

// endLoop ends the weather: it marks the end of the run in the log, thaws
// every frozen worker and sets the true time back.
func (s *supervisor) endLoop() error {
	s.log.add(Event{Kind: KindStop})
	var errs []error
	for len(s.frozen) > 0 { // thaw takes the worker off the list, whatever happens
		if err := s.thaw(s.frozen[0].w); err != nil {
			errs = append(errs, err)
		}
	}
	if s.clock != nil {
		if err := s.clock.close(); err != nil {
			errs = append(errs, err)
		} else {
			say(s.cfg.Progress, "set the clock back to the true time")
		}
	}
	return errors.Join(errs...)
}

// stopAll ends the workers gracefully: closing stdin makes each release
// what it holds and exit. A worker that has not exited after stopWait is
// stuck, and logged as such.
func (s *supervisor) stopAll() {
	for len(s.frozen) > 0 { // a stopped worker cannot read its stdin
		_ = thaw(s.frozen[0].w.cmd.Process)
		s.frozen = s.frozen[1:]
	}
	for _, w := range s.workers {
		_ = w.stdin.Close()
	}
	wait := s.stopWait()
	for _, w := range s.workers {
		done := make(chan struct{})
		go func() { _ = w.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(wait):
			s.log.add(Event{Kind: KindStuck, Proc: w.name, PID: w.cmd.Process.Pid, DurNS: int64(wait)})
			_ = w.cmd.Process.Kill()
			<-done
		}
	}
	s.workers = nil
}

func say(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// stopWait bounds how long a worker takes to stop: its current call, then
// releasing up to maxHeld ports, each call bounded by the timeout but
// normally quick.
func (s *supervisor) stopWait() time.Duration { return 20*time.Second + 2*s.cfg.Timeout }
