package fleet_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/store"
)

// The test binary doubles as a second berth process of a host (see the
// "grab" role).
func TestMain(m *testing.M) {
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}

// lo4 is the address the Allocators of the tests bind-probe.
var lo4 = netip.MustParseAddr("127.0.0.1")

// fleetDSN returns a connection string to a schema of this test's own on
// the server BERTH_TEST_POSTGRES names, and a connection to it for checks
// in raw SQL, or skips the test.
func fleetDSN(tb testing.TB) (string, *pgx.Conn) {
	tb.Helper()
	base := os.Getenv("BERTH_TEST_POSTGRES")
	if base == "" || strings.Contains(base, "://") {
		tb.Skip("set BERTH_TEST_POSTGRES to a key=value PostgreSQL DSN to run the fleet-store tests (bash .ci/postgres start prints one)")
	}
	ctx := context.Background()
	dsn, drop, err := pgschema.Create(ctx, base, "berth_fleet")
	if err != nil {
		tb.Fatalf("BERTH_TEST_POSTGRES: %v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("drop the test's schema: %v", err)
		}
	})
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(ctx) })
	return dsn, conn
}

// freeRun holds the package's test ports (the Allocators of these tests
// bind-probe there) until tb ends, and returns the first of n consecutive
// ports of them that are all bindable now.
func freeRun(tb testing.TB, n int) uint16 {
	tb.Helper()
	testports.Hold(tb, testports.FleetLayer)
	pick := store.Range(testports.FleetLayer)
	runs := pick.Size() / n
	start := rand.IntN(runs)
	for i := range runs {
		base := pick.First + uint16((start+i)%runs*n)
		ok := true
		for p := base; ok && p < base+uint16(n); p++ {
			l, err := net.Listen("tcp", netip.AddrPortFrom(lo4, p).String())
			if err != nil {
				ok = false
				continue
			}
			_ = l.Close()
		}
		if ok {
			return base
		}
	}
	tb.Fatalf("no run of %d free ports in %v", n, pick)
	return 0
}

// newFleet returns an Allocator of fleet.New for cfg, reading no BERTH_*
// variable, on a state directory of the test's own; closed when the test
// ends. Its log, unless cfg has a Logger, is shown when the test fails.
func newFleet(tb testing.TB, cfg portalloc.Config) *portalloc.Allocator {
	tb.Helper()
	cfg.IgnoreEnv = true
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	if cfg.Logger.GetSink() == nil {
		var log testproc.Buffer
		cfg.Logger = portalloc.TextLogger(&log, slog.LevelInfo)
		tb.Cleanup(func() {
			if tb.Failed() {
				tb.Logf("log of the Allocator of host %s:\n%s", cfg.Host, log.String())
			}
		})
	}
	a, err := fleet.New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("fleet.New: %v", err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return a
}

// rows returns the reservation rows of the fleet's store as
// "host:port:pid" (pid 0 for a named holder's, host "" for a fleet-wide
// one), sorted.
func rows(tb testing.TB, conn *pgx.Conn) []string {
	tb.Helper()
	r, err := conn.Query(context.Background(), "SELECT coalesce(h.host_id, '') || ':' || p.port || ':' || coalesce(p.owner_pid, 0)"+
		" FROM berth_port_allocations p LEFT JOIN berth_hosts h USING (host_no) ORDER BY 1")
	if err != nil {
		tb.Fatal(err)
	}
	out, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func row(host string, port uint16, pid int) string {
	return host + ":" + strconv.Itoa(int(port)) + ":" + strconv.Itoa(pid)
}

// TestNewReservesInTheFleetStore: with a Config.StoreDSN, fleet.New's
// Allocators reserve in the PostgreSQL store as the host Config.Host, and
// never from the MRU file; the Allocators of a process share the store and
// never get one port twice; a Release gives the port back, and Close what
// the Allocator still held.
func TestNewReservesInTheFleetStore(t *testing.T) {
	dsn, conn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 3)
	cfg := portalloc.Config{StoreDSN: dsn, Host: "fleet-a", Range: store.Range{First: base, Last: base + 2}, Order: portalloc.OrderLowest}
	a1 := newFleet(t, cfg)
	a2 := newFleet(t, cfg)
	if got := a1.Config(); got.Mode != portalloc.ModeStateStore || got.Host != "fleet-a" {
		t.Errorf("fleet.New: Config() Mode %q, Host %q; want %q (no fallback), fleet-a", got.Mode, got.Host, portalloc.ModeStateStore)
	}
	r1, err := a1.Allocate(ctx, portalloc.Request{Label: "web"})
	if err != nil || r1.Port != base || r1.Owner.PID != os.Getpid() {
		t.Fatalf("Allocate = %+v, %v; want %d, this process's", r1, err, base)
	}
	r2, err := a2.Allocate(ctx, portalloc.Request{Label: "api"})
	if err != nil || r2.Port != base+1 {
		t.Fatalf("second Allocator's Allocate = %+v, %v; want %d, the next port", r2, err, base+1)
	}
	self := os.Getpid()
	if got, want := rows(t, conn), []string{row("fleet-a", base, self), row("fleet-a", base+1, self)}; !slices.Equal(got, want) {
		t.Errorf("rows of the fleet's store = %v; want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(a1.Config().StateDir, "mru.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the MRU file after grants from the fleet's store: %v; want none", err)
	}
	if err := a1.Release(ctx, r1); err != nil {
		t.Fatalf("Release(%v) = %v", r1.Key, err)
	}
	again, err := a2.Allocate(ctx, portalloc.Request{Label: "again"})
	if err != nil || again.Port != base {
		t.Errorf("Allocate after the release = %+v, %v; want %d back", again, err, base)
	}
	if _, err := a1.Allocate(ctx, portalloc.Request{Label: "last"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a1.Allocate(ctx, portalloc.Request{Label: "none"}); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Allocate on a full range = %v; want ErrExhausted", err)
	}
	if ports, reserved, err := a1.Usage(ctx); err != nil || ports != 3 || reserved != 3 {
		t.Errorf("Usage = %d, %d, %v; want 3 ports, 3 reserved", ports, reserved, err)
	}
	if err := a2.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := rows(t, conn), []string{row("fleet-a", base+2, self)}; !slices.Equal(got, want) {
		t.Errorf("rows after the second Allocator's Close = %v; want the first's one, %v", got, want)
	}
}

// TestNewTakesTheEnvironment: a zero Config's store and host come from
// BERTH_STORE and BERTH_HOST; with IgnoreEnv, fleet.New is portalloc.New,
// on the SQLite store of the state directory.
func TestNewTakesTheEnvironment(t *testing.T) {
	dsn, conn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 2)
	dir := t.TempDir()
	t.Setenv("BERTH_STORE", dsn)
	t.Setenv("BERTH_HOST", "env-host")
	t.Setenv("BERTH_STATE_DIR", dir)
	t.Setenv("BERTH_PORT_RANGE", store.Range{First: base, Last: base + 1}.String())
	a, err := fleet.New(ctx, portalloc.Config{})
	if err != nil {
		t.Fatalf("fleet.New from the environment = %v", err)
	}
	defer a.Close()
	if c := a.Config(); c.Host != "env-host" || c.Mode != portalloc.ModeStateStore {
		t.Errorf("Config() = Host %q, Mode %q; want env-host, %q", c.Host, c.Mode, portalloc.ModeStateStore)
	}
	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rows(t, conn), []string{row("env-host", r.Port, os.Getpid())}; !slices.Equal(got, want) {
		t.Errorf("rows = %v; want %v", got, want)
	}

	b, err := fleet.New(ctx, portalloc.Config{IgnoreEnv: true, StateDir: dir, Range: store.Range{First: base, Last: base + 1}, Mode: portalloc.ModeStateStore})
	if err != nil {
		t.Fatalf("fleet.New with IgnoreEnv = %v", err)
	}
	defer b.Close()
	if c := b.Config(); c.StoreDSN != "" {
		t.Errorf("Config().StoreDSN with IgnoreEnv = %q; want none", c.StoreDSN)
	}
	rb, err := b.Allocate(ctx, portalloc.Request{})
	if err != nil || rb.Port == r.Port {
		// The port a holds is locked on this machine, whatever the store.
		t.Errorf("Allocate on the SQLite store = %+v, %v; want the other port", rb, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "berth.db")); err != nil {
		t.Errorf("the SQLite store of the state directory: %v; want it made", err)
	}
	if got := rows(t, conn); len(got) != 1 {
		t.Errorf("rows of the fleet's store after a grant of the SQLite store = %v; want only a's", got)
	}
}

// TestNewNeverFallsBack: a fleet's store that cannot be reached is an error
// wrapping store.ErrUnavailable in every mode, and the MRU file is never
// written: its grants would be invisible to the other hosts. The MRU mode
// cannot serve a fleet, and what is no store is refused.
func TestNewNeverFallsBack(t *testing.T) {
	dir := t.TempDir()
	nowhere := filepath.Join(t.TempDir(), "no-server-here")
	if err := os.Mkdir(nowhere, 0o700); err != nil {
		t.Fatal(err)
	}
	rng := store.Range{First: testports.FleetLayer.First, Last: testports.FleetLayer.First + 9}
	for _, mode := range []portalloc.Mode{"", portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback} {
		a, err := fleet.New(context.Background(), portalloc.Config{Mode: mode, StateDir: dir, StoreDSN: nowhere, Range: rng, IgnoreEnv: true, Timeout: 5 * time.Second})
		if a != nil {
			_ = a.Close()
		}
		var oe *portalloc.OpError
		if !errors.Is(err, store.ErrUnavailable) || !errors.As(err, &oe) {
			t.Errorf("New with mode %q and an unreachable store = %v; want an *OpError wrapping ErrUnavailable", mode, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "mru.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an unreachable fleet store left mru.json (%v); want no MRU file", err)
	}
	for _, tc := range []struct {
		cfg   portalloc.Config
		field string
	}{
		{portalloc.Config{StoreDSN: "db.example"}, "Config.StoreDSN"},
		{portalloc.Config{StoreDSN: "relative/dir"}, "Config.StoreDSN"},
		{portalloc.Config{StoreDSN: "postgres://db.example/berth", Mode: portalloc.ModeMRU}, "Config.Mode"},
	} {
		tc.cfg.StateDir, tc.cfg.Range, tc.cfg.IgnoreEnv = dir, rng, true
		a, err := fleet.New(context.Background(), tc.cfg)
		if a != nil {
			_ = a.Close()
		}
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("New(StoreDSN %q, Mode %q) = %v; want a *store.FieldError for %s", tc.cfg.StoreDSN, tc.cfg.Mode, err, tc.field)
		}
	}
}

// TestOpen: fleet.Open opens the store of a Config as the Config's host,
// from BERTH_STORE and BERTH_HOST unless IgnoreEnv; a fleet-wide
// reservation made through it keeps its port from every Allocator of the
// fleet, which neither allocates it nor reserves it, and the port comes
// back once released. A Config without a store, or with one that cannot
// be reached, is refused with an *OpError.
func TestOpen(t *testing.T) {
	dsn, conn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 2)
	t.Setenv("BERTH_STORE", dsn)
	t.Setenv("BERTH_HOST", "tool-host")
	s, err := fleet.Open(ctx, portalloc.Config{})
	if err != nil {
		t.Fatalf("fleet.Open from the environment = %v", err)
	}
	defer s.Close()
	if s.Host() != "tool-host" {
		t.Errorf("fleet.Open: Host() = %q; want tool-host, from BERTH_HOST", s.Host())
	}
	named, err := fleet.Open(ctx, portalloc.Config{StoreDSN: dsn, Host: "named-host"})
	if err != nil {
		t.Fatalf("fleet.Open with a Host = %v", err)
	}
	if named.Host() != "named-host" {
		t.Errorf("fleet.Open: Host() = %q; want named-host, the Config's", named.Host())
	}
	_ = named.Close()

	band := store.Range{First: base, Last: base + 1}
	const holder = "pod/default/web-0"
	r, err := s.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: band, Holder: holder, Label: "web", TTL: time.Hour})
	if err != nil || !band.Contains(r.Port) {
		t.Fatalf("ReserveFleet = %+v, %v; want a port of %v", r, err, band)
	}
	a := newFleet(t, portalloc.Config{StoreDSN: dsn, Host: "fleet-a", Range: band})
	_, err = a.Reserve(ctx, portalloc.Request{Label: "x"}, r.Port)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.Holder != holder {
		t.Errorf("an Allocator's Reserve of the fleet-wide port = %v; want a *store.ConflictError naming %s", err, holder)
	}
	got, err := a.Allocate(ctx, portalloc.Request{Label: "other"})
	if err != nil || got.Port == r.Port {
		t.Errorf("Allocate on a range with a fleet-wide port = %+v, %v; want the other port", got, err)
	}
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Allocate once only the fleet-wide port is left = %v; want ErrExhausted", err)
	}
	if leases, err := s.Leases(ctx); err != nil || len(leases) != 1 || leases[0].Holder != holder || leases[0].Port != r.Port {
		t.Errorf("Leases = %+v, %v; want %s's one", leases, err, holder)
	}
	if err := s.ReleaseFleet(ctx, r.Key, holder); err != nil {
		t.Fatalf("ReleaseFleet = %v", err)
	}
	back, err := a.Reserve(ctx, portalloc.Request{Label: "back"}, r.Port)
	if err != nil {
		t.Errorf("Reserve of the fleet-wide port once released = %v; want granted", err)
	}
	want := slices.Sorted(slices.Values([]string{row("fleet-a", got.Port, os.Getpid()), row("fleet-a", back.Port, os.Getpid())}))
	if got := rows(t, conn); !slices.Equal(got, want) {
		t.Errorf("rows = %v; want %v", got, want)
	}
	// A fleet's named holders are the store's (ReserveFleet): the
	// Allocator's ReleaseHolder finds none of theirs among its host's
	// rows, and touches nothing.
	if n, err := a.ReleaseHolder(ctx, holder, store.Filter{}); n != 0 || !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReleaseHolder(%s) on a fleet's Allocator = %d, %v; want 0, ErrNotFound", holder, n, err)
	}
	if got := rows(t, conn); !slices.Equal(got, want) {
		t.Errorf("rows after ReleaseHolder = %v; want %v", got, want)
	}

	for _, cfg := range []portalloc.Config{{IgnoreEnv: true}, {IgnoreEnv: true, StoreDSN: "db.example"}} {
		_, err := fleet.Open(ctx, cfg)
		var (
			oe *portalloc.OpError
			fe *store.FieldError
		)
		if !errors.As(err, &oe) || !errors.As(err, &fe) || fe.Field != "Config.StoreDSN" || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("fleet.Open(StoreDSN %q) = %v; want an *OpError wrapping a *store.FieldError for Config.StoreDSN", cfg.StoreDSN, err)
		}
	}
	nowhere := filepath.Join(t.TempDir(), "no-server-here")
	if err := os.Mkdir(nowhere, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err = fleet.Open(ctx, portalloc.Config{IgnoreEnv: true, StoreDSN: nowhere, Timeout: 5 * time.Second})
	var oe *portalloc.OpError
	if !errors.As(err, &oe) || !errors.Is(err, store.ErrStorage) {
		t.Errorf("fleet.Open of an unreachable store = %v; want an *OpError wrapping ErrStorage", err)
	}
}
