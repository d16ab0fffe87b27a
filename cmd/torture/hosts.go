package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/netns"
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
// drops it.
func runSchema(ctx context.Context, dsn string) (string, func() error, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", nil, fmt.Errorf("torture: -store: %w", err)
	}
	schema := fmt.Sprintf("berth_torture_%d", rand.Uint64()>>1)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		_ = conn.Close(ctx)
		return "", nil, fmt.Errorf("torture: -store: %w", err)
	}
	// The schema goes even when ctx has ended: the run is over then.
	after := context.WithoutCancel(ctx)
	drop := func() error {
		defer func() { _ = conn.Close(after) }()
		_, err := conn.Exec(after, "DROP SCHEMA "+schema+" CASCADE")
		return err
	}
	return withSearchPath(dsn, schema), drop, nil
}

// withSearchPath sets search_path in a key=value or URL connection string.
func withSearchPath(dsn, schema string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " search_path=" + schema
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn // pgx.Connect parsed it; it does not come here
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// retireHost retires host from the host by, through pgstore's public
// API (what berth host retire calls), and returns the rows it deleted.
func retireHost(ctx context.Context, dsn, by, host string, timeout time.Duration) (int, error) {
	st, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: by, Timeout: timeout, SweepInterval: -1, LeaseTTL: -1})
	if err != nil {
		return 0, fmt.Errorf("torture: retire %s: %w", host, err)
	}
	defer func() { _ = st.Close() }()
	n, err := st.RetireHost(ctx, host)
	if err != nil {
		return 0, fmt.Errorf("torture: retire %s: %w", host, err)
	}
	return n, nil
}
