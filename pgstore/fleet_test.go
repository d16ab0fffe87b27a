package pgstore_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// reserveFleet reserves a fleet-wide tcp port of first..last for holder,
// under a lease of an hour: other programs' tests step this machine's
// clock (see internal/clocklock), by minutes at times, and a shorter lease
// could run out, and be reaped, in the middle of a test.
func reserveFleet(tb testing.TB, s *pgstore.Store, holder string, first, last uint16) pgstore.FleetReservation {
	tb.Helper()
	r, err := s.ReserveFleet(context.Background(), pgstore.FleetRequest{
		Protocol: store.TCP, Band: store.Range{First: first, Last: last}, Holder: holder, Label: "fleet", TTL: time.Hour})
	if err != nil {
		tb.Fatalf("ReserveFleet(%s, %d-%d) = %v", holder, first, last, err)
	}
	return r
}

// wantLeaseConflict checks that err is a *store.ConflictError naming
// holder's lease.
func wantLeaseConflict(tb testing.TB, what string, err error, holder string) {
	tb.Helper()
	var ce *store.ConflictError
	switch {
	case !errors.As(err, &ce) || !errors.Is(err, store.ErrHeld):
		tb.Errorf("%s = %v; want a *store.ConflictError", what, err)
	case ce.Holder.Owner != (store.Owner{Holder: holder}) || ce.Self || ce.Bound:
		tb.Errorf("%s: holder = %+v; want the named holder %q and nothing else", what, ce.Holder.Owner, holder)
	case !strings.Contains(err.Error(), `holder "`+holder+`"`) || strings.Contains(err.Error(), "outside berth"):
		tb.Errorf("%s: message %q; want it to name the lease %q", what, err, holder)
	}
}

// TestFleetPortBlocksEveryHost: a fleet-wide port is taken for the
// processes of every host, whatever address they ask for, and skipped by
// their scans; List, which shows process rows, does not show it.
func TestFleetPortBlocksEveryHost(t *testing.T) {
	dsn, _ := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	b := openWith(t, dsn, pgstore.Options{Host: "host-b"})
	r := reserveFleet(t, a, "pod/default/web-0", 59000, 59000)
	if r.Port != 59000 || r.Addr.String() != "0.0.0.0" || r.Host != "" || r.Holder != "pod/default/web-0" {
		t.Fatalf("ReserveFleet = %+v; want port 59000 on 0.0.0.0, no host", r)
	}
	if !r.Expires.After(r.Created) {
		t.Errorf("lease expires %v, created %v; want after", r.Expires, r.Created)
	}
	for _, s := range []*pgstore.Store{a, b} {
		for _, addr := range []string{"127.0.0.1", "::1", "0.0.0.0"} {
			_, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, addr, 59000)})
			wantLeaseConflict(t, s.Host()+": Reserve tcp "+addr, err, "pod/default/web-0")
		}
		got, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: r.Addr, Next: storetest.Candidates(59000, 59001)})
		if err != nil || got.Port != 59001 {
			t.Errorf("%s: Scan(59000, 59001) = %v, %v; want 59001", s.Host(), got.Port, err)
		}
		list, err := s.List(ctx, store.Filter{Port: 59000})
		if err != nil || len(list) != 0 {
			t.Errorf("%s: List(port 59000) = %v, %v; want no process rows", s.Host(), list, err)
		}
	}
	// udp is another port.
	if _, err := b.Reserve(ctx, store.Request{Key: key(store.UDP, "0.0.0.0", 59000)}); err != nil {
		t.Errorf("Reserve udp 59000 = %v; want granted", err)
	}
}

// TestFleetPortsDistinct: concurrent ReserveFleet calls from two hosts
// never get one port twice, skip ports any host's process holds, and the
// band runs out with store.ErrExhausted.
func TestFleetPortsDistinct(t *testing.T) {
	dsn, _ := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	b := openWith(t, dsn, pgstore.Options{Host: "host-b"})
	if _, err := b.Reserve(ctx, store.Request{Key: key(store.TCP, "::1", 59103)}); err != nil {
		t.Fatal(err)
	}
	const n = 9 // the band 59100-59109 less b's 59103
	stock := []*pgstore.Store{a, b}
	got := drawAtOnce(t, n, func(i int) (pgstore.FleetReservation, error) {
		return stock[i%2].ReserveFleet(ctx, pgstore.FleetRequest{
			Protocol: store.TCP, Band: store.Range{First: 59100, Last: 59109}, Holder: "job/batch-" + string(rune('a'+i))})
	})
	want := []uint16{59100, 59101, 59102, 59104, 59105, 59106, 59107, 59108, 59109}
	if !slices.Equal(got, want) {
		t.Errorf("ports granted = %v; want %v, each once", got, want)
	}
	_, err := a.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 59100, Last: 59109}, Holder: "job/late"})
	if !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ReserveFleet on a full band = %v; want store.ErrExhausted", err)
	}
	for _, bad := range []pgstore.FleetRequest{
		{Protocol: store.TCP, Band: store.Range{First: 59100, Last: 59109}},                                 // no holder
		{Protocol: store.TCP, Band: store.Range{First: 59109, Last: 59100}, Holder: "x"},                    // reversed
		{Protocol: "sctp", Band: store.Range{First: 59100, Last: 59109}, Holder: "x"},                       // protocol
		{Protocol: store.TCP, Band: store.Range{First: 59100, Last: 59109}, Holder: "x\n"},                  // control character
		{Protocol: store.TCP, Band: store.Range{First: 59100, Last: 59109}, Holder: "x", TTL: -time.Second}, // ttl
	} {
		if _, err := a.ReserveFleet(ctx, bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ReserveFleet(%+v) = %v; want store.ErrInvalid", bad, err)
		}
	}
}

// TestFleetRenewReleaseHolderChecked: only the holder renews or releases
// its lease, and the renewal is by the server's clock.
func TestFleetRenewReleaseHolderChecked(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	r := reserveFleet(t, a, "pod/default/web-0", 59200, 59209)
	if err := a.RenewFleet(ctx, r.Key, "pod/default/web-1", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RenewFleet by another holder = %v; want store.ErrNotFound", err)
	}
	if err := a.ReleaseFleet(ctx, r.Key, "pod/default/web-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReleaseFleet by another holder = %v; want store.ErrNotFound", err)
	}
	if err := a.RenewFleet(ctx, r.Key, "pod/default/web-0", time.Hour); err != nil {
		t.Fatalf("RenewFleet = %v", err)
	}
	var left time.Duration
	if err := conn.QueryRow(ctx, "SELECT extract(epoch FROM lease_expires - now())::float8 * 1e9 FROM berth_port_allocations WHERE holder = $1",
		"pod/default/web-0").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left < 59*time.Minute || left > time.Hour {
		t.Errorf("lease left after RenewFleet(1h) = %v by the server's clock; want about 1h", left)
	}
	if err := a.ReleaseFleet(ctx, r.Key, "pod/default/web-0"); err != nil {
		t.Fatalf("ReleaseFleet = %v", err)
	}
	if err := a.ReleaseFleet(ctx, r.Key, "pod/default/web-0"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReleaseFleet again = %v; want store.ErrNotFound", err)
	}
	if err := a.RenewFleet(ctx, r.Key, "pod/default/web-0", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RenewFleet after release = %v; want store.ErrNotFound", err)
	}
	if _, err := a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", r.Port)}); err != nil {
		t.Errorf("Reserve after ReleaseFleet = %v; want granted", err)
	}
}

// TestFleetNarrow: narrowed to host-a, the port is free on host-b and
// still the holder's on host-a, under its lease.
func TestFleetNarrow(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	b := openWith(t, dsn, pgstore.Options{Host: "host-b"})
	const holder = "pod/default/web-0"
	r := reserveFleet(t, b, holder, 59300, 59309)
	if err := b.NarrowFleet(ctx, r.Key, "pod/default/web-1", "host-a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("NarrowFleet by another holder = %v; want store.ErrNotFound", err)
	}
	if err := b.NarrowFleet(ctx, r.Key, holder, "host-a"); err != nil {
		t.Fatalf("NarrowFleet(host-a) = %v", err)
	}
	if err := b.NarrowFleet(ctx, r.Key, holder, "host-a"); err != nil {
		t.Errorf("NarrowFleet(host-a) again = %v; want nil", err)
	}
	if err := b.NarrowFleet(ctx, r.Key, holder, "host-b"); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("NarrowFleet(host-b) after host-a = %v; want store.ErrInvalid", err)
	}
	if _, err := b.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", r.Port)}); err != nil {
		t.Errorf("host-b: Reserve after narrowing to host-a = %v; want granted", err)
	}
	_, err := a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", r.Port)})
	wantLeaseConflict(t, "host-a: Reserve after narrowing", err, holder)

	leases, err := a.Leases(ctx)
	if err != nil || len(leases) != 1 || leases[0].Host != "host-a" || leases[0].Holder != holder || leases[0].Port != r.Port {
		t.Errorf("Leases = %+v, %v; want %s's lease on host-a", leases, err, holder)
	}
	// Neither host's own rows list it, nor does retiring host-a take it.
	if n, err := b.Retire(ctx, "host-a", pgstore.RetireOptions{Force: true}); err != nil || n != 0 {
		t.Errorf("Retire(host-a, Force) = %d, %v; want 0 process rows", n, err)
	}
	if err := a.RenewFleet(ctx, r.Key, holder, time.Minute); err != nil {
		t.Errorf("RenewFleet after narrowing and retirement = %v", err)
	}

	// A host no berth has run on yet is registered by name.
	r2 := reserveFleet(t, b, "pod/default/web-1", 59300, 59309)
	if err := b.NarrowFleet(ctx, r2.Key, "pod/default/web-1", "node-7"); err != nil {
		t.Fatalf("NarrowFleet(node-7) = %v", err)
	}
	var lapsed bool
	if err := conn.QueryRow(ctx, "SELECT expires_at <= now() FROM berth_hosts WHERE host_id = 'node-7'").Scan(&lapsed); err != nil || !lapsed {
		t.Errorf("node-7 registered with a lapsed lease = %v, %v; want true", lapsed, err)
	}
	if err := a.ReleaseFleet(ctx, r.Key, holder); err != nil {
		t.Errorf("ReleaseFleet after narrowing = %v", err)
	}
	if _, err := a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", r.Port)}); err != nil {
		t.Errorf("host-a: Reserve after the lease's release = %v; want granted", err)
	}
}

// TestFleetLeaseReaped: a lease that ran out, by the server's clock, is
// deleted by the Reap of any host, fleet-wide or narrowed, and counted.
func TestFleetLeaseReaped(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	b := openWith(t, dsn, pgstore.Options{Host: "host-b"})
	wide := reserveFleet(t, a, "job/one", 59400, 59409)
	narrow := reserveFleet(t, a, "job/two", 59400, 59409)
	live := reserveFleet(t, a, "job/three", 59400, 59409)
	if err := a.NarrowFleet(ctx, narrow.Key, "job/two", "host-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "UPDATE berth_port_allocations SET lease_expires = now() - interval '1 second' WHERE holder IN ('job/one', 'job/two')"); err != nil {
		t.Fatal(err)
	}
	n, err := b.Reap(ctx)
	if err != nil || n != 2 {
		t.Fatalf("host-b: Reap = %d, %v; want the 2 lapsed leases", n, err)
	}
	if got := b.Stats().Reaped; got != 2 {
		t.Errorf("Stats().Reaped = %d; want 2", got)
	}
	leases, err := b.Leases(ctx)
	if err != nil || len(leases) != 1 || leases[0].Holder != "job/three" {
		t.Errorf("Leases after Reap = %+v, %v; want job/three's only", leases, err)
	}
	for _, p := range []uint16{wide.Port, narrow.Port} {
		if _, err := a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", p)}); err != nil {
			t.Errorf("host-a: Reserve %d after its lease was reaped = %v; want granted", p, err)
		}
	}
	_, err = a.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", live.Port)})
	wantLeaseConflict(t, "Reserve of a live lease's port", err, "job/three")

	// A lapsed lease in the way of ReserveFleet is reaped by it.
	if _, err := conn.Exec(ctx, "UPDATE berth_port_allocations SET lease_expires = now() - interval '1 second' WHERE holder = 'job/three'"); err != nil {
		t.Fatal(err)
	}
	r, err := b.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: live.Port, Last: live.Port}, Holder: "job/four"})
	if err != nil || r.Port != live.Port {
		t.Errorf("ReserveFleet over a lapsed lease = %v, %v; want %d", r.Port, err, live.Port)
	}
}

// TestFleetRowsInSQL: the database itself keeps a fleet-wide row out of
// every host's way, and a row's owner consistent with its kind.
func TestFleetRowsInSQL(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	openWith(t, dsn, pgstore.Options{Host: "host-b"})
	reserveFleet(t, a, "pod/default/web-0", 59500, 59500)
	exec := func(q string, args ...any) error {
		_, err := conn.Exec(ctx, q, args...)
		return err
	}
	processRow := func(host string, port int) error {
		return exec(`INSERT INTO berth_port_allocations (host_no, protocol, port, address, owner_pid, owner_start, kind)
			SELECT host_no, 'tcp', $2, '10.0.0.1', 1, 1, 'static' FROM berth_hosts WHERE host_id = $1`, host, port)
	}
	for _, c := range []struct {
		name string
		err  error
		code string
	}{
		{"host-a row under the fleet-wide row", processRow("host-a", 59500), pgerrExclusion},
		{"host-b row under the fleet-wide row", processRow("host-b", 59500), pgerrExclusion},
		{"second fleet-wide row", exec(`INSERT INTO berth_port_allocations (protocol, port, address, owner_kind, holder, lease_expires, kind)
			VALUES ('tcp', 59500, '10.0.0.2', 'lease', 'other', now() + interval '1 minute', 'dynamic')`), pgerrExclusion},
		{"fleet-wide row over a host row", func() error {
			if err := processRow("host-b", 59501); err != nil {
				return err
			}
			return exec(`INSERT INTO berth_port_allocations (protocol, port, address, owner_kind, holder, lease_expires, kind)
				VALUES ('tcp', 59501, '0.0.0.0', 'lease', 'other', now() + interval '1 minute', 'dynamic')`)
		}(), pgerrExclusion},
		{"lease row without an expiry", exec(`INSERT INTO berth_port_allocations (protocol, port, address, owner_kind, holder, kind)
			VALUES ('tcp', 59502, '0.0.0.0', 'lease', 'other', 'dynamic')`), pgerrCheck},
		{"lease row without a holder", exec(`INSERT INTO berth_port_allocations (protocol, port, address, owner_kind, lease_expires, kind)
			VALUES ('tcp', 59502, '0.0.0.0', 'lease', now(), 'dynamic')`), pgerrCheck},
		{"process row without a host", exec(`INSERT INTO berth_port_allocations (protocol, port, address, owner_pid, owner_start, kind)
			VALUES ('tcp', 59502, '0.0.0.0', 1, 1, 'static')`), pgerrCheck},
		{"process row without a pid", exec(`INSERT INTO berth_port_allocations (host_no, protocol, port, address, kind)
			SELECT host_no, 'tcp', 59502, '0.0.0.0', 'static' FROM berth_hosts WHERE host_id = 'host-a'`), pgerrCheck},
	} {
		var pgErr *pgconn.PgError
		if !errors.As(c.err, &pgErr) || pgErr.Code != c.code {
			t.Errorf("%s: %v; want SQLSTATE %s", c.name, c.err, c.code)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations WHERE port = 59500").Scan(&n); err != nil || n != 1 {
		t.Errorf("rows of port 59500 = %d, %v; want the fleet-wide one", n, err)
	}
}

// TestFleetStartWraps: the search starts where the store says and wraps
// round to the band's first port, and a band whose every port is held
// is exhausted wherever the search starts.
func TestFleetStartWraps(t *testing.T) {
	dsn, _ := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	b := openWith(t, dsn, pgstore.Options{Host: "host-b"})
	a.SetFleetStart(func(n int) int { return 5 })
	if r := reserveFleet(t, a, "job/first", 59600, 59609); r.Port != 59605 {
		t.Errorf("ReserveFleet from offset 5 = %d; want 59605", r.Port)
	}
	for p := uint16(59606); p <= 59609; p++ {
		if _, err := b.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", p)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint16
	for i := range 5 {
		got = append(got, reserveFleet(t, a, "job/wrap-"+string(rune('a'+i)), 59600, 59609).Port)
	}
	if want := []uint16{59600, 59601, 59602, 59603, 59604}; !slices.Equal(got, want) {
		t.Errorf("ReserveFleet from offset 5 past the held ports = %v; want %v (wrapped round)", got, want)
	}
	for _, start := range []int{0, 5, 9, 12} {
		a.SetFleetStart(func(n int) int { return start })
		_, err := a.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 59600, Last: 59609}, Holder: "job/late"})
		if !errors.Is(err, store.ErrExhausted) {
			t.Errorf("ReserveFleet from offset %d on a full band = %v; want store.ErrExhausted", start, err)
		}
	}
}

// TestFleetStartSpread: controllers reserving at the same moment start
// at random ports of the band, not all at its lowest. (Starting at the
// lowest, the eight would get exactly the band's first eight ports.)
func TestFleetStartSpread(t *testing.T) {
	dsn, _ := testDB(t)
	ctx := context.Background()
	s := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	const n = 8
	got := drawAtOnce(t, n, func(i int) (pgstore.FleetReservation, error) {
		return s.ReserveFleet(ctx, pgstore.FleetRequest{
			Protocol: store.TCP, Band: store.Range{First: 50000, Last: 50999}, Holder: "job/spread-" + string(rune('a'+i)), TTL: time.Hour})
	})
	if len(slices.Compact(slices.Clone(got))) != n {
		t.Fatalf("ports granted = %v; want %d distinct", got, n)
	}
	if got[n-1] == 50000+n-1 {
		t.Errorf("ports granted = %v; want them spread over 50000-50999, not the band's lowest %d", got, n)
	}
}

// fleetSet is a set of n tcp requests on first..last for holder.
func fleetSet(holder string, n int, first, last uint16) []pgstore.FleetRequest {
	reqs := make([]pgstore.FleetRequest, n)
	for i := range reqs {
		reqs[i] = pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: first, Last: last}, Holder: holder,
			Label: holder + "/" + string(rune('a'+i)), TTL: time.Hour}
	}
	return reqs
}

// TestFleetSetAllOrNone: a set the band cannot hold leaves no row behind;
// one it can hold gets distinct ports, all under the holder's lease.
func TestFleetSetAllOrNone(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	b := openWith(t, dsn, pgstore.Options{Host: "host-b"})
	if _, err := b.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 59702)}); err != nil {
		t.Fatal(err)
	}
	// 59700-59703 less b's 59702: three ports for a set of four.
	_, err := a.ReserveFleetSet(ctx, fleetSet("pod/default/big", 4, 59700, 59703))
	if !errors.Is(err, store.ErrExhausted) || !strings.Contains(err.Error(), "port 3 of the set") {
		t.Errorf("ReserveFleetSet of 4 on 3 free ports = %v; want store.ErrExhausted naming port 3", err)
	}
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations WHERE owner_kind = 'lease'").Scan(&rows); err != nil || rows != 0 {
		t.Errorf("lease rows after the failed set = %d, %v; want none left behind", rows, err)
	}
	// One request of another band that is full fails the set too.
	reqs := fleetSet("pod/default/mixed", 2, 59700, 59703)
	reqs = append(reqs, pgstore.FleetRequest{Protocol: store.TCP, Band: store.Range{First: 59702, Last: 59702}, Holder: "pod/default/mixed"})
	if _, err := a.ReserveFleetSet(ctx, reqs); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ReserveFleetSet with a held fixed port = %v; want store.ErrExhausted", err)
	}
	if leases, err := a.Leases(ctx); err != nil || len(leases) != 0 {
		t.Errorf("Leases after the failed sets = %v, %v; want none", leases, err)
	}

	got, err := a.ReserveFleetSet(ctx, fleetSet("pod/default/web", 3, 59700, 59703))
	if err != nil || len(got) != 3 {
		t.Fatalf("ReserveFleetSet of 3 = %+v, %v", got, err)
	}
	var ports []uint16
	for i, r := range got {
		if r.Holder != "pod/default/web" || r.Label != "pod/default/web/"+string(rune('a'+i)) || r.Host != "" || !r.Expires.After(r.Created) {
			t.Errorf("set port %d = %+v; want the holder's, labelled in request order, fleet-wide, under a lease", i, r)
		}
		ports = append(ports, r.Port)
	}
	slices.Sort(ports)
	if want := []uint16{59700, 59701, 59703}; !slices.Equal(ports, want) {
		t.Errorf("set ports = %v; want %v", ports, want)
	}
	for _, r := range got {
		if err := a.RenewFleet(ctx, r.Key, "pod/default/web", time.Hour); err != nil {
			t.Errorf("RenewFleet(%v) of a set's port = %v", r.Key, err)
		}
	}

	for _, bad := range [][]pgstore.FleetRequest{
		nil,
		append(fleetSet("pod/default/x", 1, 59700, 59703), fleetSet("pod/default/y", 1, 59700, 59703)...), // two holders
		{{Protocol: store.TCP, Band: store.Range{First: 59703, Last: 59700}, Holder: "x"}},                // reversed band
	} {
		if _, err := a.ReserveFleetSet(ctx, bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ReserveFleetSet(%+v) = %v; want store.ErrInvalid", bad, err)
		}
	}
}

// TestFleetSetsConcurrent: sets reserved at once from two hosts never
// share a port, and together fill the band exactly.
func TestFleetSetsConcurrent(t *testing.T) {
	dsn, _ := testDB(t)
	ctx := context.Background()
	stock := []*pgstore.Store{
		openWith(t, dsn, pgstore.Options{Host: "host-a"}),
		openWith(t, dsn, pgstore.Options{Host: "host-b"}),
	}
	const sets, size = 8, 3
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // guards got
		got = map[uint16]string{}
	)
	for i := range sets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := "job/set-" + string(rune('a'+i))
			rs, err := stock[i%2].ReserveFleetSet(ctx, fleetSet(holder, size, 59800, 59800+sets*size-1))
			if err != nil {
				t.Errorf("ReserveFleetSet(%s) = %v", holder, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, r := range rs {
				if prev, dup := got[r.Port]; dup {
					t.Errorf("port %d granted to %s and %s", r.Port, prev, holder)
				}
				got[r.Port] = holder
			}
		}()
	}
	wg.Wait()
	if len(got) != sets*size {
		t.Errorf("%d ports granted; want %d, each once", len(got), sets*size)
	}
	_, err := stock[0].ReserveFleetSet(ctx, fleetSet("job/late", 1, 59800, 59800+sets*size-1))
	if !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ReserveFleetSet on a full band = %v; want store.ErrExhausted", err)
	}
	leases, err := stock[1].Leases(ctx)
	if err != nil || len(leases) != sets*size {
		t.Errorf("Leases = %d, %v; want %d", len(leases), err, sets*size)
	}
}

const (
	pgerrExclusion = "23P01"
	pgerrCheck     = "23514"
)

// drawAtOnce runs draw(0) to draw(n-1) in goroutines of their own, all at
// once, and returns the ports they were granted, sorted. A failed draw
// fails the test.
func drawAtOnce(tb testing.TB, n int, draw func(i int) (pgstore.FleetReservation, error)) []uint16 {
	tb.Helper()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // guards got
		got []uint16
	)
	for i := range n {
		wg.Go(func() {
			r, err := draw(i)
			if err != nil {
				tb.Errorf("ReserveFleet #%d = %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			got = append(got, r.Port)
		})
	}
	wg.Wait()
	slices.Sort(got)
	return got
}

// TestFleetCallsAfterClose: every fleet-wide call of a closed store, and
// Retire, fail with ErrClosed, and change nothing.
func TestFleetCallsAfterClose(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	s := openWith(t, dsn, pgstore.Options{Host: "host-a"})
	openWith(t, dsn, pgstore.Options{Host: "host-b"})
	r := reserveFleet(t, s, "job/one", 59900, 59909)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	band := store.Range{First: 59900, Last: 59909}
	for name, call := range map[string]func() error{
		"ReserveFleet": func() error {
			_, err := s.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: band, Holder: "job/two"})
			return err
		},
		"ReserveFleetSet": func() error {
			_, err := s.ReserveFleetSet(ctx, fleetSet("job/two", 2, 59900, 59909))
			return err
		},
		"RenewFleet":   func() error { return s.RenewFleet(ctx, r.Key, r.Holder, time.Hour) },
		"ReleaseFleet": func() error { return s.ReleaseFleet(ctx, r.Key, r.Holder) },
		"NarrowFleet":  func() error { return s.NarrowFleet(ctx, r.Key, r.Holder, "host-b") },
		"Leases": func() error {
			_, err := s.Leases(ctx)
			return err
		},
		"Retire": func() error {
			_, err := s.Retire(ctx, "host-b", pgstore.RetireOptions{Force: true})
			return err
		},
	} {
		if err := call(); !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close = %v; want ErrClosed", name, err)
		}
	}
	var rows []string
	r2, err := conn.Query(ctx, "SELECT coalesce(holder, '') || '@' || coalesce(host_no, 0) FROM berth_port_allocations ORDER BY 1")
	if err == nil {
		rows, err = pgx.CollectRows(r2, pgx.RowTo[string])
	}
	if err != nil || !slices.Equal(rows, []string{"job/one@0"}) {
		t.Errorf("rows after the calls of a closed store = %v, %v; want job/one's fleet-wide one only", rows, err)
	}
}
