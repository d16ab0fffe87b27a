package portalloc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/portalloc/statedir"
)

// fleetDSN returns a connection string to a schema of this test's own on
// the server BERTH_TEST_POSTGRES names, or skips the test.
func fleetDSN(tb testing.TB) string {
	tb.Helper()
	base := os.Getenv("BERTH_TEST_POSTGRES")
	if base == "" || strings.Contains(base, "://") {
		tb.Skip("set BERTH_TEST_POSTGRES to a key=value PostgreSQL DSN to run the fleet-store tests (bash .ci/postgres start prints one)")
	}
	dsn, drop, err := pgschema.Create(context.Background(), base, "berth_portalloc")
	if err != nil {
		tb.Fatalf("BERTH_TEST_POSTGRES: %v", err)
	}
	tb.Cleanup(func() { _ = drop() })
	return dsn
}

// TestFleetStore: with Config.StoreDSN an Allocator keeps its reservations in
// PostgreSQL, per host: two hosts get the same lowest port, one host never
// gets one port twice, and a Release gives it back.
func TestFleetStore(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 4)
	rng := portalloc.Range{First: base, Last: base + 3}
	cfg := portalloc.Config{StoreDSN: dsn, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest}
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
	if u, err := expvarmetrics.ReadUsage(ctx, b); err != nil || u.Reserved != 1 {
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
		_, err := fleet.New(context.Background(), portalloc.Config{Mode: mode, StateDir: dir, StoreDSN: nowhere, Range: allocRange})
		if !errors.Is(err, portalloc.ErrStoreUnavailable) {
			t.Errorf("New with mode %q and an unreachable Store = %v; want ErrStoreUnavailable", mode, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, statedir.MRUFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an unreachable fleet store left %s (%v); want no MRU file", statedir.MRUFile, err)
	}
}

// TestStoreConfigRefused: Config.StoreDSN and BERTH_STORE take connection
// strings only, and the MRU mode cannot serve a fleet.
func TestStoreConfigRefused(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg   portalloc.Config
		field string
	}{
		{portalloc.Config{StoreDSN: "db.example"}, "Config.StoreDSN"},
		{portalloc.Config{StoreDSN: "relative/dir"}, "Config.StoreDSN"},
		{portalloc.Config{StoreDSN: "postgres://db.example/berth", Mode: portalloc.ModeMRU}, "Config.Mode"},
	} {
		tc.cfg.StateDir = t.TempDir()
		_, err := portalloc.New(ctx, tc.cfg)
		var fe *portalloc.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("New(Store %q, Mode %q) = %v; want a *FieldError for %s", tc.cfg.StoreDSN, tc.cfg.Mode, err, tc.field)
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
	if err != nil || cfg.StoreDSN != "postgres://u:secret@db.example/berth" || cfg.Host != "ci-7" {
		t.Errorf("ConfigFromEnv = %+v, %v; want Store and Host from BERTH_STORE and BERTH_HOST", cfg, err)
	}
}

// TestFleetReservationsNeedAFleetStore: on the SQLite store every
// fleet-wide call says it needs a Config.StoreDSN, and changes nothing.
func TestFleetReservationsNeedAFleetStore(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	r := fleet.FleetReservation{Holder: "pod/default/web-0"}
	spec := portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "g", Ports: []portset.PortSpec{{Name: "p"}}}}}
	for name, call := range map[string]func() error{
		"ReserveFleet": func() error {
			_, err := fleet.Reserve(ctx, a, fleet.FleetRequest{Protocol: portalloc.TCP, Band: fleet.Band{First: 27000, Last: 27001}, Holder: "x"})
			return err
		},
		"ReserveFleetSet": func() error {
			_, err := fleet.ReserveSet(ctx, a, fleet.FleetSetRequest{Spec: spec, Band: fleet.Band{First: 27000, Last: 27001}, Holder: "x"})
			return err
		},
		"RenewFleet":   func() error { return fleet.Renew(ctx, a, r, 0) },
		"ReleaseFleet": func() error { return fleet.Release(ctx, a, r) },
		"NarrowFleet":  func() error { return fleet.Narrow(ctx, a, r, "node-1") },
		"FleetLeases": func() error {
			_, err := fleet.Leases(ctx, a)
			return err
		},
	} {
		err := call()
		var fe *portalloc.FieldError
		if !errors.As(err, &fe) || fe.Field != "Config.StoreDSN" || !errors.Is(err, portalloc.ErrInvalidRequest) ||
			!strings.Contains(err.Error(), "fleet's PostgreSQL store") || !strings.HasPrefix(err.Error(), "portalloc: ") {
			t.Errorf("%s on the SQLite store = %v; want a *FieldError for Config.StoreDSN saying it needs a fleet's store", name, err)
		}
	}
}

// TestFleetReservations: through an Allocator, a fleet-wide reservation
// keeps its port from every host's processes, is renewed, narrowed and
// released by its holder only, outlives the Allocator's Close, and a
// full band says so.
func TestFleetReservations(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 2)
	band := fleet.Band{First: base, Last: base + 1}
	cfg := portalloc.Config{StoreDSN: dsn, Range: allocRange, AllowEphemeralOverlap: true}
	hostA, hostB := cfg, cfg
	hostA.Host, hostB.Host = "host-a", "host-b"
	ctl := newAllocator(t, hostA)
	b := newAllocator(t, hostB)

	r, err := fleet.Reserve(ctx, ctl, fleet.FleetRequest{Protocol: portalloc.TCP, Band: band, Holder: "pod/default/web-0", Label: "web", TTL: time.Hour})
	if err != nil || r.Port < base || r.Port > base+1 || r.Host != "" || r.Addr.String() != "0.0.0.0" {
		t.Fatalf("ReserveFleet = %+v, %v; want a port of %d-%d on 0.0.0.0, fleet-wide", r, err, base, base+1)
	}
	_, err = b.Reserve(ctx, portalloc.Request{Label: "x"}, r.Port)
	var ce *portalloc.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, portalloc.ErrPortHeld) || ce.Holder.Owner.Name != "pod/default/web-0" {
		t.Errorf("host-b Reserve of the fleet-wide port = %v; want a *ConflictError naming the lease", err)
	}
	other := r
	other.Holder = "pod/default/web-1"
	if err := fleet.Renew(ctx, ctl, other, time.Minute); !errors.Is(err, portalloc.ErrNotHeld) {
		t.Errorf("RenewFleet by another holder = %v; want ErrNotHeld", err)
	}
	if err := fleet.Renew(ctx, b, r, 2*time.Hour); err != nil {
		t.Errorf("RenewFleet from another host's Allocator = %v", err)
	}
	var tfe *portalloc.FieldError
	if err := fleet.Renew(ctx, b, r, -time.Second); !errors.As(err, &tfe) || tfe.Field != "ttl" {
		t.Errorf("RenewFleet(-1s) = %v; want a *FieldError for ttl", err)
	}
	_, err = fleet.Reserve(ctx, ctl, fleet.FleetRequest{Protocol: portalloc.TCP, Band: band, Holder: ""})
	var fe *portalloc.FieldError
	if !errors.As(err, &fe) || fe.Field != "holder" || !strings.HasPrefix(err.Error(), `portalloc: reserve fleet-wide: holder "": want`) || strings.Count(err.Error(), "portalloc: ") != 1 {
		t.Errorf("ReserveFleet without a holder = %v; want a *FieldError for holder, prefixed once", err)
	}
	if _, err := fleet.Reserve(ctx, ctl, fleet.FleetRequest{Protocol: portalloc.TCP, Band: band, Holder: "pod/default/web-1", TTL: time.Hour}); err != nil {
		t.Fatalf("ReserveFleet of the band's other port = %v", err)
	}
	_, err = fleet.Reserve(ctx, ctl, fleet.FleetRequest{Protocol: portalloc.TCP, Band: band, Holder: "pod/default/web-2"})
	if !errors.Is(err, portalloc.ErrRangeExhausted) || strings.Count(err.Error(), "portalloc: ") != 1 {
		t.Errorf("ReserveFleet on a full band = %v; want ErrRangeExhausted, prefixed once", err)
	}

	if err := ctl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Leases(ctx, ctl); !errors.Is(err, portalloc.ErrClosed) {
		t.Errorf("FleetLeases after Close = %v; want ErrClosed", err)
	}
	leases, err := fleet.Leases(ctx, b)
	if err != nil || len(leases) != 2 || leases[0].Holder != "pod/default/web-0" || leases[0].Port != r.Port || leases[0].Label != "web" {
		t.Fatalf("FleetLeases after the controller's Close = %+v, %v; want both leases, web-0's first", leases, err)
	}
	if err := fleet.Narrow(ctx, b, leases[0], "host-a"); err != nil {
		t.Fatalf("NarrowFleet(host-a) = %v", err)
	}
	if got, err := b.Reserve(ctx, portalloc.Request{Label: "x"}, r.Port); err != nil {
		t.Errorf("host-b Reserve once narrowed to host-a = %v; want granted", err)
	} else if err := b.Release(ctx, got); err != nil {
		t.Error(err)
	}
	if err := fleet.Release(ctx, b, leases[0]); err != nil {
		t.Errorf("ReleaseFleet = %v", err)
	}
	if err := fleet.Release(ctx, b, leases[0]); !errors.Is(err, portalloc.ErrNotHeld) || strings.Count(err.Error(), "portalloc: ") != 1 {
		t.Errorf("ReleaseFleet again = %v; want ErrNotHeld, prefixed once", err)
	}
}

// TestFleetSet: a set spec reserved fleet-wide gets every port or none:
// on a band too small for it nothing is left behind.
func TestFleetSet(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 4)
	a := newAllocator(t, portalloc.Config{StoreDSN: dsn, Host: "host-a", Range: allocRange, AllowEphemeralOverlap: true})
	spec := portset.SetSpec{Name: "shop", Groups: []portset.GroupSpec{
		{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}},
		{Name: "lb", Ports: []portset.PortSpec{{Name: "admin", Scope: portset.ScopeGroup}}},
	}}
	// Leases of an hour: other programs' tests step this machine's clock.
	req := fleet.FleetSetRequest{Spec: spec, Band: fleet.Band{First: base, Last: base + 1}, Holder: "job/shop", TTL: time.Hour}
	if _, err := fleet.ReserveSet(ctx, a, req); !errors.Is(err, portalloc.ErrRangeExhausted) {
		t.Errorf("ReserveFleetSet of 3 ports on a band of 2 = %v; want ErrRangeExhausted", err)
	}
	if leases, err := fleet.Leases(ctx, a); err != nil || len(leases) != 0 {
		t.Errorf("FleetLeases after the failed set = %+v, %v; want none left behind", leases, err)
	}
	req.Band.Last = base + 3
	rs, err := fleet.ReserveSet(ctx, a, req)
	if err != nil || len(rs) != 3 {
		t.Fatalf("ReserveFleetSet = %+v, %v; want 3 ports", rs, err)
	}
	seen := map[uint16]bool{}
	for i, want := range []string{"shop/api/0/http", "shop/api/1/http", "shop/lb/admin"} {
		if rs[i].Label != want || rs[i].Holder != "job/shop" || seen[rs[i].Port] || rs[i].Port < base || rs[i].Port > base+3 {
			t.Errorf("set port %d = %+v; want %s, job/shop's, a port of its own in the band", i, rs[i], want)
		}
		seen[rs[i].Port] = true
	}

	bad := req
	bad.Spec.Groups = []portset.GroupSpec{{Name: "api", Ports: []portset.PortSpec{{Name: "http", Prefer: []uint16{base}}}}}
	var se *portalloc.FieldError
	if _, err := fleet.ReserveSet(ctx, a, bad); !errors.As(err, &se) || se.Field != "SetSpec" || se.At != "groups[0].ports[0].prefer" ||
		!strings.HasPrefix(err.Error(), `portalloc: reserve fleet-wide set "shop": SetSpec`) || strings.Count(err.Error(), "portalloc: ") != 1 {
		t.Errorf("ReserveFleetSet with prefer = %v; want a *FieldError for SetSpec at groups[0].ports[0].prefer, prefixed once", err)
	}
	bad = req
	bad.Holder = ""
	var fe *portalloc.FieldError
	if _, err := fleet.ReserveSet(ctx, a, bad); !errors.As(err, &fe) || fe.Field != "holder" || strings.Count(err.Error(), "portalloc: ") != 1 {
		t.Errorf("ReserveFleetSet without a holder = %v; want a *FieldError for holder, prefixed once", err)
	}
}
