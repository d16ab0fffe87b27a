package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
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

// openFleet opens the fleet's store as host, as a tool or a controller
// does (fleet.Open), closed with tb.
func openFleet(tb testing.TB, dsn, host string) *pgstore.Store {
	tb.Helper()
	s, err := fleet.Open(context.Background(), portalloc.Config{StoreDSN: dsn, Host: host, IgnoreEnv: true})
	if err != nil {
		tb.Fatalf("fleet.Open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func init() {
	// grab is a process of host BERTH_TEST_HOST of the fleet store
	// BERTH_TEST_DSN: it asks for each port of BERTH_TEST_PORTS, prints
	// "granted PORT" or "refused PORT PID" (the holder's pid) for each,
	// then "ready", and holds what it was granted until stdin closes.
	workers["grab"] = func(ctx context.Context) error {
		a, err := fleet.New(ctx, portalloc.Config{StoreDSN: os.Getenv("BERTH_TEST_DSN"), Host: os.Getenv("BERTH_TEST_HOST"),
			StateDir: os.Getenv("BERTH_STATE_DIR"), Timeout: 20 * time.Second, IgnoreEnv: true})
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		for f := range strings.SplitSeq(os.Getenv("BERTH_TEST_PORTS"), ",") {
			p, _ := strconv.Atoi(f)
			_, err := a.Reserve(ctx, portalloc.Request{Label: "grab"}, uint16(p))
			var ce *store.ConflictError
			switch {
			case err == nil:
				fmt.Println("granted", p)
			case errors.As(err, &ce):
				// The holder's row, or, where only a lock stands in the
				// way, the process that holds it.
				pid := ce.Holder.Owner.PID
				if pid == 0 && len(ce.PIDs) > 0 {
					pid = ce.PIDs[0]
				}
				fmt.Println("refused", p, pid)
			default:
				return err
			}
		}
		fmt.Println("ready")
		_, _ = os.Stdin.Read(make([]byte, 1))
		return nil
	}
}

// TestFleetStore: with Config.StoreDSN an Allocator keeps its reservations
// in PostgreSQL, per host: one host never gets one port twice, a Release
// gives it back, and Usage counts the host's own rows. Two hosts of one
// machine share its kernel locks, so neither gets a port the other holds
// there; hosts with networks of their own (namespaces here) get the same
// lowest port.
func TestFleetStore(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 4)
	rng := store.Range{First: base, Last: base + 3}
	cfg := portalloc.Config{StoreDSN: dsn, Range: rng, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest}
	hostA, hostB := cfg, cfg
	hostA.Host, hostB.Host = "host-a", "host-b"
	a1 := newAllocator(t, hostA)
	a2 := newAllocator(t, hostA)
	b := newAllocator(t, hostB)
	if a1.Config().Mode != portalloc.ModeStateStore {
		t.Errorf("Mode with a StoreDSN = %q; want %q (no fallback)", a1.Config().Mode, portalloc.ModeStateStore)
	}

	r1, err := a1.Allocate(ctx, portalloc.Request{Label: "web"})
	if err != nil || r1.Port != base {
		t.Fatalf("host-a Allocate = %+v, %v; want %d from the store", r1, err, base)
	}
	r2, err := a2.Allocate(ctx, portalloc.Request{Label: "api"})
	if err != nil || r2.Port == r1.Port {
		t.Errorf("second Allocator of host-a = %+v, %v; want a port other than %d", r2, err, r1.Port)
	}
	rb, err := b.Allocate(ctx, portalloc.Request{Label: "web"})
	if err != nil || rb.Port == r1.Port || rb.Port == r2.Port {
		t.Errorf("host-b Allocate on the same machine = %+v, %v; want a port neither of host-a's (their locks are this machine's)", rb, err)
	}
	if _, reserved, err := b.Usage(ctx); err != nil || reserved != 1 {
		t.Errorf("host-b Usage = %d reserved, %v; want its one port", reserved, err)
	}
	if err := a1.Release(ctx, r1); err != nil {
		t.Fatalf("Release(%v) = %v", r1, err)
	}
	again, err := a2.Allocate(ctx, portalloc.Request{})
	if err != nil || again.Port != base {
		t.Errorf("host-a Allocate after the release = %+v, %v; want %d back", again, err, base)
	}

	t.Run("hosts of their own", func(t *testing.T) {
		nss := netns.ForTest(t, 1)
		cmd := testproc.Command(t, "grab")
		in := nss[0].Command(cmd.Path, cmd.Args[1:]...)
		in.Env = append(cmd.Env, "BERTH_TEST_DSN="+dsn, "BERTH_TEST_HOST=host-c", "BERTH_STATE_DIR="+t.TempDir(), "BERTH_TEST_PORTS="+strconv.Itoa(int(base)))
		w := start(t, in)
		if line := readLine(t, w); line != "granted "+strconv.Itoa(int(base)) {
			t.Errorf("host-c, in a network of its own, asking for %d, which host-a holds: %q; want granted: ports are per host", base, line)
		}
		w.ready(t)
	})
}

// TestFleetLeasesKeepPortsFromHosts: a fleet-wide lease, made through the
// fleet's store (fleet.Open), keeps its port from every host's Allocators
// until it is narrowed to another host or released; an Allocator refuses
// it naming the holder.
func TestFleetLeasesKeepPortsFromHosts(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 2)
	band := store.Range{First: base, Last: base + 1}
	ctl := openFleet(t, dsn, "host-a")
	b := newAllocator(t, portalloc.Config{StoreDSN: dsn, Host: "host-b", Range: allocRange, AllowEphemeralOverlap: true})

	r, err := ctl.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: band, Holder: "pod/default/web-0", Label: "web", TTL: time.Hour})
	if err != nil || !band.Contains(r.Port) {
		t.Fatalf("ReserveFleet = %+v, %v; want a port of %v", r, err, band)
	}
	_, err = b.Reserve(ctx, portalloc.Request{Label: "x"}, r.Port)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "pod/default/web-0") {
		t.Errorf("host-b Reserve of the fleet-wide port = %v; want a *ConflictError naming the lease's holder", err)
	}
	if got, err := b.Allocate(ctx, portalloc.Request{Prefer: []uint16{r.Port}}); err != nil || got.Port == r.Port {
		t.Errorf("host-b Allocate preferring the fleet-wide port = %v, %v; want another port", got, err)
	}
	if err := ctl.NarrowFleet(ctx, r.Key, r.Holder, "host-a"); err != nil {
		t.Fatalf("NarrowFleet(host-a) = %v", err)
	}
	got, err := b.Reserve(ctx, portalloc.Request{Label: "x"}, r.Port)
	if err != nil {
		t.Errorf("host-b Reserve once the lease is narrowed to host-a = %v; want granted", err)
	} else if err := b.Release(ctx, got); err != nil {
		t.Error(err)
	}
	if err := ctl.ReleaseFleet(ctx, r.Key, r.Holder); err != nil {
		t.Errorf("ReleaseFleet = %v", err)
	}
}

// TestFleetSet: a set spec reserved fleet-wide (fleet.SetRequests,
// ReserveFleetSet) gets every port or none: on a band too small for it
// nothing is left behind.
func TestFleetSet(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 4)
	s := openFleet(t, dsn, "host-a")
	spec := portset.SetSpec{Name: "shop", Groups: []portset.GroupSpec{
		{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}},
		{Name: "lb", Ports: []portset.PortSpec{{Name: "admin", Shared: true}}},
	}}
	reqs, err := fleet.SetRequests(spec, store.Range{First: base, Last: base + 1}, "job/shop", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReserveFleetSet(ctx, reqs); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ReserveFleetSet of 3 ports on a band of 2 = %v; want ErrExhausted", err)
	}
	if leases, err := s.Leases(ctx); err != nil || len(leases) != 0 {
		t.Errorf("Leases after the failed set = %+v, %v; want none left behind", leases, err)
	}
	reqs, err = fleet.SetRequests(spec, store.Range{First: base, Last: base + 3}, "job/shop", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.ReserveFleetSet(ctx, reqs)
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
}
