package fleet_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fleetDSN returns a connection string to a schema of this test's own on
// the server BERTH_TEST_POSTGRES names, or skips the test.
func fleetDSN(tb testing.TB) string {
	tb.Helper()
	base := os.Getenv("BERTH_TEST_POSTGRES")
	if base == "" || strings.Contains(base, "://") {
		tb.Skip("set BERTH_TEST_POSTGRES to a key=value PostgreSQL DSN to run the fleet-store tests (bash .ci/postgres start prints one)")
	}
	dsn, drop, err := pgschema.Create(context.Background(), base, "berth_fleet")
	if err != nil {
		tb.Fatalf("BERTH_TEST_POSTGRES: %v", err)
	}
	tb.Cleanup(func() { _ = drop() })
	return dsn
}

// TestNewOpensTheFleetStore: with a Config.StoreDSN, fleet.New hands portalloc
// the PostgreSQL store, whose fleet-wide calls the Allocator reaches as a
// store.FleetStore; fleet.OpenStore opens the same store for a tool.
func TestNewOpensTheFleetStore(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	cfg := portalloc.Config{StoreDSN: dsn, Host: "fleet-a", StateDir: t.TempDir()}
	a, err := fleet.New(ctx, cfg)
	if err != nil {
		t.Fatalf("fleet.New = %v", err)
	}
	defer a.Close()
	if !strings.HasPrefix(a.Database(), "PostgreSQL store ") || a.Config().Mode != portalloc.ModeStateStore {
		t.Errorf("fleet.New: Database %q, Mode %q; want the PostgreSQL store, mode statestore", a.Database(), a.Config().Mode)
	}
	r, err := fleet.Reserve(ctx, a, fleet.FleetRequest{Protocol: portalloc.TCP, Band: fleet.Band{First: 41000, Last: 41009}, Holder: "pod/default/web-0", TTL: time.Minute})
	if err != nil || r.Port < 41000 || r.Port > 41009 {
		t.Fatalf("ReserveFleet = %+v, %v; want a port of 41000-41009", r, err)
	}
	s, err := fleet.OpenStore(ctx, cfg)
	if err != nil {
		t.Fatalf("fleet.OpenStore = %v", err)
	}
	defer s.Close()
	fs, ok := s.(store.FleetStore)
	if !ok {
		t.Fatalf("fleet.OpenStore = %T; want a store.FleetStore", s)
	}
	leases, err := fs.Leases(ctx)
	if err != nil || len(leases) != 1 || leases[0].Port != r.Port || leases[0].Holder != r.Holder {
		t.Errorf("Leases through fleet.OpenStore = %+v, %v; want the one of %+v", leases, err, r)
	}
	if err := fleet.Release(ctx, a, r); err != nil {
		t.Errorf("ReleaseFleet = %v", err)
	}
}

// TestNewWithoutStore: without a Config.StoreDSN, fleet.New and
// fleet.OpenStore are portalloc's: the SQLite store in the state directory.
func TestNewWithoutStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := fleet.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore})
	if err != nil {
		t.Fatalf("fleet.New without a Store = %v", err)
	}
	if want := dir + "/" + statedir.DatabaseFile; a.Database() != want {
		t.Errorf("Database() = %q; want %q", a.Database(), want)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	s, err := fleet.OpenStore(ctx, portalloc.Config{StateDir: dir})
	if err != nil {
		t.Fatalf("fleet.OpenStore without a Store = %v", err)
	}
	defer s.Close()
	if _, ok := s.(store.FleetStore); ok {
		t.Errorf("fleet.OpenStore without a Store = %T; want the SQLite store, no FleetStore", s)
	}
}
