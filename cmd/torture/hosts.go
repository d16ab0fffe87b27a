package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/berth-go/berth/internal/clocklock"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/pgstore"
)

// hostName is the fleet name (Config.Host) of the host of index i.
func hostName(i int) string { return fmt.Sprintf("host-%d", i+1) }

// makeHosts makes n network namespaces, named after this process so that
// two runs never meet, and returns them with the function that deletes
// them; their fleet names are hostName's. A supervisor that is SIGKILLed
// leaves them behind, for "ip netns delete berth-torture-PID-N".
func makeHosts(ctx context.Context, n int) ([]netns.NS, func() error, error) {
	if n == 0 {
		return nil, func() error { return nil }, nil
	}
	nss, remove, err := netns.AddN(ctx, fmt.Sprintf("berth-torture-%d", os.Getpid()), n)
	if err != nil {
		return nil, nil, fmt.Errorf("torture: -hosts: %w", err)
	}
	return nss, remove, nil
}

// runSchema makes a schema of the run's own on the server dsn names, so
// that no row of another run or of a fleet's real hosts meets the run's,
// and returns dsn with its search_path set to it, and the function that
// drops it, even when ctx has ended: the run is over then.
func runSchema(ctx context.Context, dsn string) (string, func() error, error) {
	scoped, drop, err := pgschema.Create(ctx, dsn, "berth_torture")
	if err != nil {
		return "", nil, fmt.Errorf("torture: -store: %w", err)
	}
	return scoped, drop, nil
}

// retireHost retires host from the host by, through pgstore's public
// API (what berth host retire --force calls), and returns the rows it
// deleted. The host's processes were all killed just before, but its
// lease still runs: the retirement is forced, as an operator who has just
// taken a host down forces it.
func retireHost(ctx context.Context, dsn, by, host string, timeout time.Duration) (int, error) {
	st, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: by, Timeout: timeout, SweepInterval: -1, LeaseTTL: -1})
	if err != nil {
		return 0, fmt.Errorf("torture: retire %s: %w", host, err)
	}
	defer func() { _ = st.Close() }() //nolint:contextcheck // Close ends the session on a context of its own, within the store's timeout
	n, err := st.Retire(ctx, host, pgstore.RetireOptions{Force: true})
	if err != nil {
		return 0, fmt.Errorf("torture: retire %s: %w", host, err)
	}
	return n, nil
}

// holdClock keeps, for a run on PostgreSQL, every program that steps the
// system clock through internal/clocklock (another torture run with
// -clock-step, a test) from doing so while the run lasts: the server
// judges host leases and fleet-wide leases by its own clock, the one of
// this machine, and a step of 300 s ends every lease at once, which hands
// the leased ports out again under holders the run has no say over. It
// waits, as long as ctx allows, for such a program to finish, and returns
// the function that lets go.
func holdClock(ctx context.Context, progress io.Writer) (unlock func() error, err error) {
	quick, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	unlock, err = clocklock.Lock(quick)
	cancel()
	if err == nil {
		return unlock, nil
	}
	if progress != nil {
		fmt.Fprintf(progress, "waiting for a program that steps the clock to finish (%s): the server's leases follow the clock\n", clocklock.Path)
	}
	if unlock, err = clocklock.Lock(ctx); err != nil {
		return nil, fmt.Errorf("torture: -store: %w", err)
	}
	return unlock, nil
}
