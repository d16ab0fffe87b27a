package pgstore_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// skewedServer starts a throwaway PostgreSQL cluster whose clock runs
// offset (a libfaketime offset, "+1h" or "-1h") off this machine's, with
// .ci/postgres under libfaketime, and returns its DSN; the cluster is
// stopped and deleted when the test ends, failed or not. It skips the test
// where PostgreSQL or libfaketime is not installed.
func skewedServer(tb testing.TB, offset string) string {
	tb.Helper()
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) == 0 {
		tb.Skip("no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql postgresql-contrib) to run with a skewed clock")
	}
	if m, _ := filepath.Glob("/usr/lib/*/faketime/libfaketime.so.1"); len(m) == 0 {
		tb.Skip("libfaketime is not installed (apt-get install faketime): it runs the test's PostgreSQL server with a clock an hour off")
	}
	script, err := filepath.Abs(filepath.Join("..", ".ci", "postgres"))
	if err != nil {
		tb.Fatal(err)
	}
	// A unix socket path must be short: not t.TempDir's.
	dir, err := os.MkdirTemp("", "berth-pgclock-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("bash", script, "stop", dir).CombinedOutput(); err != nil {
			tb.Errorf("stop the skewed server: %v: %s", err, out)
		}
	})
	cmd := exec.Command("bash", script, "start", dir)
	cmd.Env = append(os.Environ(), "BERTH_PG_FAKETIME="+offset)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("start a PostgreSQL server with its clock %s off: %v\n%s", offset, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// serverNow reads the server's clock.
func serverNow(tb testing.TB, conn *pgx.Conn) time.Time {
	tb.Helper()
	var now time.Time
	if err := conn.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		tb.Fatal(err)
	}
	return now
}

// TestClientClockAnHourOff runs the fleet's leases against a server whose
// clock is an hour ahead of, then behind, this machine's: host leases,
// their grace reaping, the check of a host name's lease and fleet-wide
// leases all follow the server's clock and ignore the client's. A client
// that computed an expiry from its own clock, or compared one with it,
// would be an hour off and fail.
func TestClientClockAnHourOff(t *testing.T) {
	for _, tt := range []struct {
		offset string
		skew   time.Duration // server minus client
	}{
		{"+1h", time.Hour},
		{"-1h", -time.Hour},
	} {
		t.Run(tt.offset, func(t *testing.T) {
			dsn := skewedServer(t, tt.offset)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(ctx) })
			if got := time.Until(serverNow(t, conn)); (got - tt.skew).Abs() > 2*time.Minute {
				t.Fatalf("the server's clock is %v off this machine's; want %v: libfaketime did not take", got.Round(time.Second), tt.skew)
			}

			// Host leases: Open's lease runs LeaseTTL from the server's now.
			const ttl = 30 * time.Second
			a := openWith(t, dsn, pgstore.Options{Host: "host-a", BootID: "boot-a", LeaseTTL: ttl, SweepInterval: -1})
			reserveN(t, a, 56300, 2)
			var left time.Duration
			if err := conn.QueryRow(ctx, "SELECT expires_at - now() FROM berth_hosts WHERE host_id = 'host-a'").Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left <= 0 || left > ttl {
				t.Errorf("host-a's lease ends %v after the server's now; want within (0, %v]", left, ttl)
			}
			// Renewal too.
			if err := a.RenewLease(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, "SELECT expires_at - now() FROM berth_hosts WHERE host_id = 'host-a'").Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left <= ttl || left > time.Minute {
				t.Errorf("host-a's lease after Renew(1m) ends %v after the server's now; want within (%v, 1m]", left, ttl)
			}

			// The lease is live by the server's clock: another boot is
			// refused the name.
			if s, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: "host-a", BootID: "boot-b", SweepInterval: -1, LeaseTTL: -1}); err == nil {
				_ = s.Close()
				t.Error("another boot opened host-a while its lease was live by the server's clock")
			} else if !errors.Is(err, store.ErrInvalid) {
				t.Errorf("another boot's Open of host-a = %v; want the host name refused (another boot holds it)", err)
			}

			// Reaping a lapsed host: a host whose lease ended 20 minutes ago
			// by the server's clock is reaped with a ReapAfter of 10 minutes, whatever
			// the client's clock says of that time; host-a, live, is kept.
			b := openWith(t, dsn, pgstore.Options{Host: "host-b", BootID: "boot-b"})
			reserveN(t, b, 56300, 3)
			expire(t, conn, "host-b", "20 minutes")
			reaper := openWith(t, dsn, pgstore.Options{Host: "reaper", BootID: "boot-r", ReapAfter: 10 * time.Minute})
			if n, err := reaper.Reap(ctx); err != nil || n != 3 {
				t.Errorf("Reap with a ReapAfter of 10m = %d, %v; want host-b's 3 rows (its lease ended 20m ago by the server's clock)", n, err)
			}
			if got := rowsOf(t, conn, "host-a"); got != 2 {
				t.Errorf("host-a's rows after Reap = %d; want its 2: its lease is live by the server's clock", got)
			}
			// A lease that ended 5 minutes ago is within the grace.
			c := openWith(t, dsn, pgstore.Options{Host: "host-c", BootID: "boot-c"})
			reserveN(t, c, 56300, 1)
			expire(t, conn, "host-c", "5 minutes")
			if n, err := reaper.Reap(ctx); err != nil || n != 0 {
				t.Errorf("Reap of a lease that ended 5m ago, grace 10m = %d, %v; want 0", n, err)
			}

			// Fleet-wide leases: set from the server's now, kept while live
			// by its clock, reaped once over by it.
			const fttl = 2 * time.Minute
			r, err := a.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 59500, Last: 59509}, Holder: "pod/default/web-0", TTL: fttl})
			if err != nil {
				t.Fatal(err)
			}
			if d := r.Expires.Sub(r.Created); d != fttl {
				t.Errorf("fleet lease runs from %v to %v, %v; want the TTL %v of the server's clock", r.Created, r.Expires, d, fttl)
			}
			if d := time.Until(r.Created); (d - tt.skew).Abs() > 2*time.Minute {
				t.Errorf("fleet lease created %v off this machine's clock; want the server's time, %v off", d.Round(time.Second), tt.skew)
			}
			if err := a.RenewFleet(ctx, r.Key, r.Holder, 3*time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, "SELECT lease_expires - now() FROM berth_port_allocations WHERE holder = $1", r.Holder).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left <= fttl || left > 3*time.Minute {
				t.Errorf("fleet lease after RenewFleet(3m) ends %v after the server's now; want within (%v, 3m]", left, fttl)
			}
			old, err := b.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 59500, Last: 59509}, Holder: "pod/default/old-0", TTL: fttl})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "UPDATE berth_port_allocations SET lease_expires = now() - interval '1 second' WHERE holder = $1", old.Holder); err != nil {
				t.Fatal(err)
			}
			if n, err := reaper.Reap(ctx); err != nil || n != 1 {
				t.Errorf("Reap with one fleet lease over by a second = %d, %v; want 1", n, err)
			}
			leases, err := reaper.Leases(ctx)
			if err != nil || len(leases) != 1 || leases[0].Holder != r.Holder {
				t.Errorf("Leases after Reap = %+v, %v; want only %s's, live by the server's clock", leases, err, r.Holder)
			}
		})
	}
}
