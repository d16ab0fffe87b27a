package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/portalloc"
)

// fleetDSN returns a connection string to a schema of this test's own on
// the server BERTH_TEST_POSTGRES names, or skips the test.
func fleetDSN(tb testing.TB) string {
	tb.Helper()
	base := os.Getenv("BERTH_TEST_POSTGRES")
	if base == "" || strings.Contains(base, "://") {
		tb.Skip("set BERTH_TEST_POSTGRES to a key=value PostgreSQL DSN to run the fleet-store tests (bash .ci/postgres start prints one)")
	}
	ctx := context.Background()
	schema := fmt.Sprintf("berth_portalloc_%d", rand.Uint64()>>1)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("connect to BERTH_TEST_POSTGRES: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	})
	return base + " search_path=" + schema
}

// TestFleetStore: with Config.Store an Allocator keeps its reservations in
// PostgreSQL, per host: two hosts get the same lowest port, one host never
// gets one port twice, and a Release gives it back.
func TestFleetStore(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 4)
	rng := portalloc.Range{First: base, Last: base + 3}
	cfg := portalloc.Config{Store: dsn, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest}
	hostA, hostB := cfg, cfg
	hostA.Host, hostB.Host = "host-a", "host-b"
	a1 := newAllocator(t, hostA)
	a2 := newAllocator(t, hostA)
	b := newAllocator(t, hostB)
	if a1.Config().Mode != portalloc.ModeStateStore {
		t.Errorf("Mode with a Store = %q; want %q (no fallback)", a1.Config().Mode, portalloc.ModeStateStore)
	}

	r1, err := a1.Allocate(ctx, portalloc.Request{Label: "web"})
	if err != nil || r1.Port != base || r1.Backend != portalloc.BackendStateStore {
		t.Fatalf("host-a Allocate = %+v, %v; want %d from the store", r1, err, base)
	}
	r2, err := a2.Allocate(ctx, portalloc.Request{Label: "api"})
	if err != nil || r2.Port == r1.Port {
		t.Errorf("second Allocator of host-a = %+v, %v; want a port other than %d", r2, err, r1.Port)
	}
	rb, err := b.Allocate(ctx, portalloc.Request{Label: "web"})
	if err != nil || rb.Port != base {
		t.Errorf("host-b Allocate = %+v, %v; want %d too: ports are per host", rb, err, base)
	}
	if err := a1.Release(ctx, r1); err != nil {
		t.Fatalf("Release(%v) = %v", r1, err)
	}
	again, err := a2.Allocate(ctx, portalloc.Request{})
	if err != nil || again.Port != base {
		t.Errorf("host-a Allocate after the release = %+v, %v; want %d back", again, err, base)
	}
	if u, err := b.Usage(ctx); err != nil || u.Reserved != 1 {
		t.Errorf("host-b Usage = %+v, %v; want its one port", u, err)
	}
}

// TestFleetStoreNeverFallsBack: a fleet's store that cannot be reached is
// an error in every mode, and the MRU file is never written: its grants
// would be invisible to the other hosts.
func TestFleetStoreNeverFallsBack(t *testing.T) {
	dir := t.TempDir()
	nowhere := filepath.Join(t.TempDir(), "no-server-here")
	if err := os.Mkdir(nowhere, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []portalloc.Mode{"", portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback} {
		_, err := portalloc.New(context.Background(), portalloc.Config{Mode: mode, StateDir: dir, Store: nowhere, Range: allocRange})
		if !errors.Is(err, portalloc.ErrStoreUnavailable) {
			t.Errorf("New with mode %q and an unreachable Store = %v; want ErrStoreUnavailable", mode, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, portalloc.MRUFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an unreachable fleet store left %s (%v); want no MRU file", portalloc.MRUFile, err)
	}
}

// TestStoreConfigRefused: Config.Store and BERTH_STORE take connection
// strings only, and the MRU mode cannot serve a fleet.
func TestStoreConfigRefused(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg   portalloc.Config
		field string
	}{
		{portalloc.Config{Store: "db.example"}, "Config.Store"},
		{portalloc.Config{Store: "relative/dir"}, "Config.Store"},
		{portalloc.Config{Store: "postgres://db.example/berth", Mode: portalloc.ModeMRU}, "Config.Mode"},
	} {
		tc.cfg.StateDir = t.TempDir()
		_, err := portalloc.New(ctx, tc.cfg)
		var fe *portalloc.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("New(Store %q, Mode %q) = %v; want a *FieldError for %s", tc.cfg.Store, tc.cfg.Mode, err, tc.field)
		}
	}
	t.Setenv(portalloc.EnvStore, "db.example")
	_, err := portalloc.ConfigFromEnv()
	var fe *portalloc.FieldError
	if !errors.As(err, &fe) || fe.Field != portalloc.EnvStore {
		t.Errorf("ConfigFromEnv with BERTH_STORE=db.example = %v; want a *FieldError for BERTH_STORE", err)
	}
	t.Setenv(portalloc.EnvStore, "postgres://u:secret@db.example/berth")
	t.Setenv(portalloc.EnvHost, "ci-7")
	cfg, err := portalloc.ConfigFromEnv()
	if err != nil || cfg.Store != "postgres://u:secret@db.example/berth" || cfg.Host != "ci-7" {
		t.Errorf("ConfigFromEnv = %+v, %v; want Store and Host from BERTH_STORE and BERTH_HOST", cfg, err)
	}
}
