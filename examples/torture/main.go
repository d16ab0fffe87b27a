// Command torture runs berth's torture harness: worker processes allocate,
// bind, release and hand off ports on one state store while random workers
// are SIGKILLed, and a checker proves from their logs that no port was ever
// live in two hands and nothing was left behind.
//
//	go run ./examples/torture                      # 20 s on 64 ports, 6 workers
//	go run ./examples/torture -duration 10m -range 20000-32767
//
// It exits 1 when any invariant was violated.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	flag.StringVar(&cfg.Dir, "dir", "", "keep state and logs here (default: a temporary directory, removed)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "random seed (default: random)")
	flag.BoolVar(&verbose, "v", false, "print each kill")
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := torture.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		os.Exit(1)
	}
	sum.Print(os.Stdout)
	if !sum.OK() {
		os.Exit(1)
	}
}
