// Command torture runs berth's torture harness: worker processes allocate,
// bind, release and hand off ports on one state store while random workers
// are SIGKILLed, and a checker proves from their logs that no port was ever
// live in two hands and nothing was left behind.
//
//	go run ./examples/torture                      # 20 s on 64 ports, 6 workers
//	go run ./examples/torture -duration 10m -range 20000-32767
//	sudo go run ./examples/torture -clock-step     # steps the system clock: root only
//	go run ./examples/torture -freeze              # SIGSTOPs random workers
//
// -clock-step steps the host's wall clock by 300 s either way and by
// fractions of a second while the workers run, and sets the true time back
// at the end (also on an error or Ctrl-C; not if the harness itself is
// SIGKILLed). -freeze stops random workers for up to 3 s, sometimes inside
// the store's write lock, and kills some while stopped; no worker
// completing a call for longer than -timeout plus a margin fails the run.
//
// It exits 1 when any invariant was violated.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/berth-go/berth/internal/torture"
	"github.com/berth-go/berth/portalloc"
)

func main() {
	torture.MaybeRunRole() // workers and children are this same binary

	var (
		cfg     torture.Config
		rangeS  string
		verbose bool
	)
	flag.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long the workers run")
	flag.IntVar(&cfg.Workers, "workers", 6, "worker processes")
	flag.StringVar(&rangeS, "range", torture.SmallRange.String(), "port range FIRST-LAST")
	flag.DurationVar(&cfg.KillEvery, "kill-every", 500*time.Millisecond, "SIGKILL a random worker this often (negative: never)")
	flag.DurationVar(&cfg.Timeout, "timeout", 0, "bound of every portalloc call of the workers (default 10s, 1s with -freeze)")
	flag.BoolVar(&cfg.ClockStep, "clock-step", false, "step the system clock (CLOCK_REALTIME) every 1-2 s while workers run; needs root")
	flag.BoolVar(&cfg.Freeze, "freeze", false, "SIGSTOP a random worker about every second for 100ms-3s, then SIGCONT or SIGKILL it")
	flag.StringVar(&cfg.Dir, "dir", "", "keep state and logs here (default: a temporary directory, removed)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "random seed (default: random)")
	flag.BoolVar(&verbose, "v", false, "print each kill, freeze and clock step")
	flag.Parse()

	r, err := portalloc.ParseRange(rangeS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture: -range:", err)
		os.Exit(2)
	}
	cfg.Range = r
	if verbose {
		cfg.Progress = os.Stderr
	}
	// Run sets a stepped clock back before it returns: let every signal
	// that ends a terminal session end it through ctx instead.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	sum, err := torture.Run(ctx, cfg)
	if err != nil {
		if errors.Is(err, torture.ErrNeedsRoot) {
			fmt.Fprintln(os.Stderr, "torture: -clock-step:", strings.TrimPrefix(err.Error(), "torture: "))
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "torture:", err)
		os.Exit(1)
	}
	sum.Print(os.Stdout)
	if !sum.OK() {
		os.Exit(1)
	}
}
