package fleet_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// TestSetRequests: one request per port of the spec, in spec order (a
// per-member port once per member, a shared one once), labelled as
// portset labels a set's ports, for the holder under its TTL: a port that
// is not fixed drawn from the band, a fixed one reserved as it is, with
// the port's protocol (zero: tcp) and address (zero: left to ReserveFleet,
// which takes 0.0.0.0).
func TestSetRequests(t *testing.T) {
	band := store.Range{First: 40000, Last: 40999}
	v6 := netip.MustParseAddr("::1")
	spec := portset.SetSpec{Name: "shop", Groups: []portset.GroupSpec{
		{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}, {Name: "admin", Shared: true, Protocol: store.UDP, Addr: v6}}},
		{Name: "db", Ports: []portset.PortSpec{{Name: "pg", Port: 5432}}},
	}}
	got, err := fleet.SetRequests(spec, band, "job/shop", time.Hour)
	if err != nil {
		t.Fatalf("SetRequests = %v", err)
	}
	fixed := store.Range{First: 5432, Last: 5432}
	want := []pgstore.FleetRequest{
		{Protocol: store.TCP, Band: band, Holder: "job/shop", Label: "shop/api/0/http", TTL: time.Hour},
		{Protocol: store.TCP, Band: band, Holder: "job/shop", Label: "shop/api/1/http", TTL: time.Hour},
		{Protocol: store.UDP, Addr: v6, Band: band, Holder: "job/shop", Label: "shop/api/admin", TTL: time.Hour},
		{Protocol: store.TCP, Band: fixed, Holder: "job/shop", Label: "shop/db/0/pg", TTL: time.Hour},
	}
	if len(got) != len(want) {
		t.Fatalf("SetRequests = %+v; want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d = %+v; want %+v", i, got[i], want[i])
		}
	}
	// Zero TTL stays zero: ReserveFleetSet makes it pgstore.DefaultFleetTTL.
	if got, err := fleet.SetRequests(spec, band, "job/shop", 0); err != nil || got[0].TTL != 0 {
		t.Errorf("SetRequests with no TTL = %+v, %v; want TTL 0", got, err)
	}
}

// TestSetRequestsRefused: what chooses among a host's range (prefer,
// order, sticky) is refused naming the port, a spec that is not valid as
// Validate refuses it, and a set of more than pgstore.MaxFleetSet ports,
// each with a *store.FieldError for "SetSpec" in a *portalloc.OpError.
func TestSetRequestsRefused(t *testing.T) {
	band := store.Range{First: 40000, Last: 40999}
	one := func(p portset.PortSpec) portset.SetSpec {
		return portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			{Name: "ok", Ports: []portset.PortSpec{{Name: "p"}}},
			{Name: "g", Ports: []portset.PortSpec{{Name: "q"}, p}},
		}}
	}
	for _, tc := range []struct {
		spec      portset.SetSpec
		at, value string
	}{
		{one(portset.PortSpec{Name: "x", Prefer: []uint16{40001}}), "groups[1].ports[1].prefer", "[40001]"},
		{one(portset.PortSpec{Name: "x", Order: portalloc.OrderLowest}), "groups[1].ports[1].order", string(portalloc.OrderLowest)},
		{one(portset.PortSpec{Name: "x", Sticky: true}), "groups[1].ports[1].sticky", "true"},
		{portset.SetSpec{Name: "big", Groups: []portset.GroupSpec{{Name: "g", Members: pgstore.MaxFleetSet + 1, Ports: []portset.PortSpec{{Name: "p"}}}}},
			"groups[0].ports[0]", "p"},
	} {
		reqs, err := fleet.SetRequests(tc.spec, band, "job/x", 0)
		var (
			oe *portalloc.OpError
			fe *store.FieldError
		)
		if reqs != nil || !errors.As(err, &oe) || !errors.As(err, &fe) || fe.Field != "SetSpec" || fe.At != tc.at || fe.Value != tc.value ||
			!errors.Is(err, store.ErrInvalid) || strings.Count(err.Error(), "portalloc: ") != 1 {
			t.Errorf("SetRequests(%s) = %d requests, %v; want an *OpError wrapping a *store.FieldError for SetSpec at %s, value %q",
				tc.at, len(reqs), err, tc.at, tc.value)
		}
	}
	for _, bad := range []portset.SetSpec{
		{},
		{Name: "s", Groups: []portset.GroupSpec{{Name: "g", Ports: []portset.PortSpec{{Name: "p"}, {Name: "p"}}}}},
		{Name: "s", Groups: []portset.GroupSpec{{Name: "g", Members: 2, Ports: []portset.PortSpec{{Name: "p", Port: 5432}}}}},
	} {
		verr := bad.Validate()
		if verr == nil {
			t.Fatalf("Validate(%+v) = nil; the case proves nothing", bad)
		}
		reqs, err := fleet.SetRequests(bad, band, "job/x", 0)
		if reqs != nil || err == nil || err.Error() != verr.Error() || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("SetRequests(%+v) = %d requests, %v; want Validate's refusal %v", bad, len(reqs), err, verr)
		}
	}
}

// TestSetReservedFleetWide: a spec's requests reserve every port or none
// through the fleet's store: on a band too small for the set nothing is
// left behind; on one large enough each port is the holder's, distinct,
// labelled in spec order.
func TestSetReservedFleetWide(t *testing.T) {
	dsn, _ := fleetDSN(t)
	ctx := context.Background()
	s, err := fleet.Open(ctx, portalloc.Config{StoreDSN: dsn, Host: "ctl", IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	spec := portset.SetSpec{Name: "shop", Groups: []portset.GroupSpec{
		{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}},
		{Name: "lb", Ports: []portset.PortSpec{{Name: "admin", Shared: true}}},
	}}
	// Leases of an hour: other programs' tests step this machine's clock.
	small := store.Range{First: 41000, Last: 41001}
	reqs, err := fleet.SetRequests(spec, small, "job/shop", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReserveFleetSet(ctx, reqs); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ReserveFleetSet of 3 ports on a band of 2 = %v; want ErrExhausted", err)
	}
	if leases, err := s.Leases(ctx); err != nil || len(leases) != 0 {
		t.Errorf("Leases after the failed set = %+v, %v; want none left behind", leases, err)
	}
	band := store.Range{First: 41000, Last: 41003}
	if reqs, err = fleet.SetRequests(spec, band, "job/shop", time.Hour); err != nil {
		t.Fatal(err)
	}
	rs, err := s.ReserveFleetSet(ctx, reqs)
	if err != nil || len(rs) != 3 {
		t.Fatalf("ReserveFleetSet = %+v, %v; want 3 ports", rs, err)
	}
	seen := map[uint16]bool{}
	for i, want := range []string{"shop/api/0/http", "shop/api/1/http", "shop/lb/admin"} {
		r := rs[i]
		if r.Label != want || r.Holder != "job/shop" || r.Host != "" || seen[r.Port] || !band.Contains(r.Port) || r.Addr != netip.IPv4Unspecified() {
			t.Errorf("set port %d = %+v; want %s, job/shop's, fleet-wide on 0.0.0.0, a port of its own in %v", i, r, want, band)
		}
		seen[r.Port] = true
	}
	if leases, err := s.Leases(ctx); err != nil || len(leases) != 3 {
		t.Errorf("Leases = %+v, %v; want the set's 3", leases, err)
	}
}
