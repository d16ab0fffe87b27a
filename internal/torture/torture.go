// Package torture proves berth's promise under load, crashes and
// contention, with the operating system as the referee.
//
// A supervisor starts worker processes that share one state directory. Each
// worker allocates, reserves, releases and hands ports to short-lived
// children at random, and binds every grant at once, so a port handed out
// twice fails the second bind in the kernel, not in berth's bookkeeping.
// The supervisor SIGKILLs random workers and starts replacements. Every
// process appends its events to a log of its own; afterwards Check reads
// them all and proves that no two conflicting grants were live at the same
// time, that every grant could be bound, and that the store keeps no row of
// a dead process once reaped.
package torture

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
)

// Config is one torture run. Zero fields take the defaults shown.
type Config struct {
	Workers   int             // worker processes at any time; zero: 6
	Duration  time.Duration   // how long workers run; zero: 20s
	Range     portalloc.Range // zero: 26000-26063, 64 ports, small enough to run full
	KillEvery time.Duration   // a random worker is SIGKILLed this often; zero: 500ms; negative: never
	Dir       string          // the run's state and logs; zero: a new temporary directory, removed afterwards
	Seed      uint64          // zero: random
	// Progress, when not nil, receives a line per kill.
	Progress io.Writer
}

// SmallRange is the default range: 64 ports for 6 workers of up to 32
// grants each, so exhaustion, reaping and contention happen all the time.
var SmallRange = portalloc.Range{First: 26000, Last: 26063}

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
	return s.ViolationCount == 0 && len(s.LeftBehind) == 0 && len(s.Errors) == 0 && s.Grants > 0
}

// Run runs the harness. It returns an error when it could not run; a run
// that found violations returns them in the Summary.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 6
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 20 * time.Second
	}
	if cfg.Range == (portalloc.Range{}) {
		cfg.Range = SmallRange
	}
	if err := cfg.Range.Valid(); err != nil {
		return Summary{}, err
	}
	if cfg.KillEvery == 0 {
		cfg.KillEvery = 500 * time.Millisecond
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "berth-torture-")
		if err != nil {
			return Summary{}, err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		cfg.Dir = dir
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o700); err != nil {
		return Summary{}, err
	}
	log, err := openLog(cfg.Dir, "supervisor")
	if err != nil {
		return Summary{}, err
	}
	defer func() { _ = log.close() }()

	sup := &supervisor{cfg: cfg, log: log, rng: rand.New(rand.NewPCG(cfg.Seed, 1))}
	start := time.Now()
	for range cfg.Workers {
		if err := sup.start(); err != nil {
			sup.stopAll()
			return Summary{}, err
		}
	}
	if err := sup.loop(ctx, start.Add(cfg.Duration)); err != nil {
		sup.stopAll()
		return Summary{}, err
	}
	sum := Summary{Config: cfg}
	// While the last workers still run: no row of a killed one may survive a Reap.
	left, err := sup.checkStore(ctx, false)
	if err != nil {
		sup.stopAll()
		return Summary{}, err
	}
	sum.LeftBehind = append(sum.LeftBehind, left...)
	sup.stopAll()
	sum.Elapsed = time.Since(start)

	rep, err := Check(cfg.Dir)
	if err != nil {
		return Summary{}, err
	}
	sum.Report = rep
	// The workers have gone and their children (which outlive killed
	// workers by design) end within a quarter second: after a Reap the
	// table must then be empty.
	deadline := time.Now().Add(15 * time.Second)
	for {
		left, err = sup.checkStore(ctx, true)
		if err != nil {
			return Summary{}, err
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sum.LeftBehind = append(sum.LeftBehind, left...)
	sum.ReapedAtEnd = sup.reapedAtEnd
	return sum, nil
}

type supervisor struct {
	cfg         Config
	log         *eventLog
	rng         *rand.Rand
	workers     []*workerProc
	started     int                // workers started, for their names
	killed      []statestore.Owner // identities of the workers killed
	reapedAtEnd int
}

type workerProc struct {
	cmd   *exec.Cmd
	stdin io.Closer
	name  string
}

func (s *supervisor) start() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	s.started++
	name := fmt.Sprintf("w%d", s.started)
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envRole+"=worker", envDir+"="+s.cfg.Dir, envProc+"="+name,
		envRange+"="+s.cfg.Range.String(), envSeed+"="+strconv.FormatUint(s.rng.Uint64(), 10))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("torture: start worker: %w", err)
	}
	s.workers = append(s.workers, &workerProc{cmd: cmd, stdin: stdin, name: name})
	return nil
}

// loop kills a random worker every KillEvery and starts a replacement,
// until the deadline.
func (s *supervisor) loop(ctx context.Context, deadline time.Time) error {
	every := s.cfg.KillEvery
	if every < 0 {
		every = time.Until(deadline) + time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	end := time.NewTimer(time.Until(deadline))
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end.C:
			return nil
		case <-t.C:
		}
		i := s.rng.IntN(len(s.workers))
		victim := s.workers[i]
		pid := victim.cmd.Process.Pid
		// Its identity, to find its rows after a Reap: pid and start time,
		// since the pid will be reused.
		id, idErr := statestore.LookupOwner(ctx, pid)
		// Logged before the signal: the victim's claims end no later.
		s.log.add(Event{Kind: KindKill, Proc: victim.name, PID: pid})
		if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return fmt.Errorf("torture: kill %s (pid %d): %w", victim.name, pid, err)
		}
		_ = victim.cmd.Wait()
		if idErr == nil {
			s.killed = append(s.killed, id)
		}
		_ = victim.stdin.Close()
		s.workers = append(s.workers[:i], s.workers[i+1:]...)
		if s.cfg.Progress != nil {
			fmt.Fprintf(s.cfg.Progress, "killed worker %s (pid %d)\n", victim.name, pid)
		}
		if err := s.start(); err != nil {
			return err
		}
	}
}

// stopAll ends the workers gracefully: closing stdin makes each release
// what it holds and exit.
func (s *supervisor) stopAll() {
	for _, w := range s.workers {
		_ = w.stdin.Close()
	}
	for _, w := range s.workers {
		done := make(chan struct{})
		go func() { _ = w.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = w.cmd.Process.Kill()
			<-done
		}
	}
	s.workers = nil
}

// checkStore reaps and lists the table. It returns the rows owned by
// killed workers (which must have been reaped); with all set, every row
// left counts, since no process of the run is alive.
func (s *supervisor) checkStore(ctx context.Context, all bool) ([]string, error) {
	st, err := statestore.Open(ctx, filepath.Join(s.cfg.Dir, "state", "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.Close() }()
	n, err := st.Reap(ctx)
	if err != nil {
		return nil, err
	}
	if all {
		s.reapedAtEnd = n
	}
	rows, err := st.List(ctx, statestore.Filter{})
	if err != nil {
		return nil, err
	}
	var left []string
	for _, r := range rows {
		if all || slices.ContainsFunc(s.killed, r.Owner.Same) {
			left = append(left, fmt.Sprintf("%s of pid %d left after Reap", r.Key, r.Owner.PID))
		}
	}
	return left, nil
}

// Print writes the summary for people.
func (s Summary) Print(w io.Writer) {
	secs := s.Elapsed.Seconds()
	fmt.Fprintf(w, "berth torture: %d workers, %v, range %s (%d ports), kill every %v, seed %d\n",
		s.Workers, s.Duration, s.Range, s.Range.Size(), s.KillEvery, s.Seed)
	fmt.Fprintf(w, "grants          %d (%.0f/s): %d allocated, %d reserved, %d handed to children\n",
		s.Grants, float64(s.Grants)/secs, s.Allocations, s.Reservations, s.Handoffs)
	fmt.Fprintf(w, "range exhausted %d times\n", s.Exhausted)
	fmt.Fprintf(w, "kills           %d\n", s.Kills)
	fmt.Fprintf(w, "rows reaped     %d by workers, %d by the final reap\n", s.ReapedByWorkers, s.ReapedAtEnd)
	fmt.Fprintf(w, "bind failures   %d\n", s.BindFailures)
	if n := len(s.Latencies); n > 0 {
		fmt.Fprintf(w, "allocate        p50 %v  p99 %v  max %v  (n=%d)\n",
			Percentile(s.Latencies, 50).Round(time.Microsecond), Percentile(s.Latencies, 99).Round(time.Microsecond),
			s.Latencies[n-1].Round(time.Microsecond), n)
	}
	fmt.Fprintf(w, "errors          %d\n", len(s.Errors))
	for _, e := range first(s.Errors, 10) {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "left behind     %d\n", len(s.LeftBehind))
	for _, e := range first(s.LeftBehind, 10) {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "violations      %d\n", s.ViolationCount)
	for _, v := range first(s.Violations, 20) {
		fmt.Fprintf(w, "  %s\n", v)
	}
}

func first(xs []string, n int) []string { return xs[:min(len(xs), n)] }
