package portalloc_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/mru"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/lease"
	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// refusal is one call given input it must refuse: field is the Field of
// the *FieldError its error must hold, and prefixed says the error is
// portalloc's (exactly one "portalloc: " before it) rather than a store's
// (none).
type refusal struct {
	name     string
	field    string
	prefixed bool
	call     func() error
}

// TestRefusedInput: every kind of bad input the public calls take is
// refused with one shape: an error that errors.As finds a *FieldError in,
// naming the field and saying what is accepted, that wraps
// ErrInvalidRequest, and that carries portalloc's prefix exactly once.
func TestRefusedInput(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	held, err := a.Allocate(ctx, portalloc.Request{Label: "refused/held"})
	if err != nil {
		t.Fatal(err)
	}
	port := freeRun(t, 1)
	dir := t.TempDir()
	// newWith runs New with cfg on a state directory of the test's.
	newWith := func(cfg portalloc.Config) error {
		if cfg.StateDir == "" {
			cfg.StateDir = dir
		}
		b, err := portalloc.New(ctx, cfg)
		if err == nil {
			_ = b.Close()
		}
		return err
	}
	req := func(r portalloc.Request) func() error {
		return func() error { _, err := a.Allocate(ctx, r); return err }
	}
	leaseOf := func(l lease.Lease) func() error {
		return func() error { _, err := lease.Allocate(ctx, a, portalloc.Request{}, l); return err }
	}
	tooMany := make([]uint16, portalloc.MaxPrefer+1)
	for i := range tooMany {
		tooMany[i] = uint16(20000 + i)
	}
	ok := lease.Lease{Holder: "ci/refused", TTL: time.Minute}
	mf := mru.New(dir+"/refused-mru.json", mru.Options{})
	t.Cleanup(func() { _ = mf.Close() })
	st, err := statestore.Open(ctx, t.TempDir()+"/berth.db", statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	// A set, another set, and a row held twice, for the calls on them.
	oneSet := func(name string) *portset.Set {
		set, err := portset.Allocate(ctx, a, portset.SetSpec{Name: name, Groups: []portset.GroupSpec{{Name: "api", Ports: []portset.PortSpec{{Name: "http"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = set.Release(ctx) })
		return set
	}
	set, other := oneSet("refused"), oneSet("refused-other")
	twice, err := a.Allocate(ctx, portalloc.Request{Label: "refused/twice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{Label: "refused/twice"}, twice.Port); err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(ctx, a, "refused", pool.Spec{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	badSpec := portset.SetSpec{Name: "refused", Groups: []portset.GroupSpec{{Name: "api", Ports: []portset.PortSpec{{Name: "http", Order: "highest"}}}}}

	for _, tc := range []refusal{
		// Allocate and the calls that share its request checks.
		{"Allocate protocol", "Request.Protocol", true, req(portalloc.Request{Protocol: "sctp"})},
		{"Allocate zoned address", "Request.Addr", true, req(portalloc.Request{Addr: netip.MustParseAddr("fe80::1%eth0")})},
		{"Allocate order", "Request.Order", true, req(portalloc.Request{Order: "highest"})},
		{"Allocate too many preferred", "Request.Prefer", true, req(portalloc.Request{Prefer: tooMany})},
		{"Allocate preferred 0", "Request.Prefer[1]", true, req(portalloc.Request{Prefer: []uint16{port, 0}})},
		{"Allocate label", "Request.Label", true, req(portalloc.Request{Label: "x\x1b]0;t\a"})},
		{"Allocate sticky without label", "Request.Label", true, req(portalloc.Request{Sticky: true})},
		{"Allocate foreign address", "Request.Addr", true, req(portalloc.Request{Addr: netip.MustParseAddr("192.0.2.7")})},
		{"Reserve port 0", "port", true, func() error { _, err := a.Reserve(ctx, portalloc.Request{}, 0); return err }},
		{"Reserve protocol", "Request.Protocol", true, func() error { _, err := a.Reserve(ctx, portalloc.Request{Protocol: "x"}, port); return err }},
		{"AllocateBlock of 0", "n", true, func() error { _, err := a.AllocateBlock(ctx, portalloc.Request{}, 0); return err }},
		{"AllocateBlock too long", "n", true, func() error { _, err := a.AllocateBlock(ctx, portalloc.Request{}, store.MaxBlock+1); return err }},
		{"AllocateBlock sticky", "Request.Sticky", true, func() error {
			_, err := a.AllocateBlock(ctx, portalloc.Request{Label: "b", Sticky: true}, 2)
			return err
		}},
		{"AllocateLease holder", "holder", true, leaseOf(lease.Lease{TTL: time.Minute})},
		{"AllocateLease ttl", "ttl", true, leaseOf(lease.Lease{Holder: "ci/x", TTL: 10000 * time.Hour})},
		{"AllocateLease sticky without label", "Request.Label", true, func() error {
			_, err := lease.Allocate(ctx, a, portalloc.Request{Sticky: true}, ok)
			return err
		}},
		{"ReserveLease port 0", "port", true, func() error { _, err := lease.Reserve(ctx, a, portalloc.Request{}, 0, ok); return err }},
		{"Renew ttl", "ttl", true, func() error { _, err := lease.Renew(ctx, a, "ci/x", 0); return err }},
		{"ReleaseHolder holder", "holder", true, func() error { _, err := lease.Release(ctx, a, "", lease.Filter{}); return err }},
		{"ReleaseHolder label", "Filter.Label", true, func() error {
			_, err := lease.Release(ctx, a, "ci/x", lease.Filter{Label: "\x1b"})
			return err
		}},
		{"Listen udp", "Request.Protocol", true, func() error { _, _, err := a.Listen(ctx, portalloc.Request{Protocol: portalloc.UDP}); return err }},
		{"ListenPacket tcp", "Request.Protocol", true, func() error {
			_, _, err := a.ListenPacket(ctx, portalloc.Request{Protocol: portalloc.TCP})
			return err
		}},
		{"Release backend", "Reservation.Backend", true, func() error {
			return a.Release(ctx, portalloc.Reservation{Protocol: portalloc.TCP, Addr: held.Addr, Port: held.Port, Backend: "nfs"})
		}},
		{"Transfer to no process", "pid", true, func() error { return a.Transfer(ctx, held, -1) }},
		{"Transfer of a row held twice", "Reservation", true, func() error { return a.Transfer(ctx, twice, os.Getpid()) }},

		// Sets, pools, fleet-wide calls and metrics: the packages over an
		// Allocator.
		{"ParseSetSpec JSON", "SetSpec", true, func() error { _, err := portset.ParseSetSpec([]byte(`{"name": 1}`)); return err }},
		{"ParseSetSpec unknown key", "SetSpec", true, func() error { _, err := portset.ParseSetSpec([]byte(`{"nmae": "x"}`)); return err }},
		{"SetSpec.Validate", "SetSpec", true, badSpec.Validate},
		{"SetSpec.ValidateOneEnv", "SetSpec", true, badSpec.ValidateOneEnv},
		{"portset.Allocate", "SetSpec", true, func() error { _, err := portset.Allocate(ctx, a, badSpec); return err }},
		{"Set.Member group", "group", true, func() error { _, err := set.Member("web", 0); return err }},
		{"Set.Member index", "index", true, func() error { _, err := set.Member("api", 1); return err }},
		{"Set.Transfer nil", "m", true, func() error { return set.Transfer(ctx, nil, os.Getpid()) }},
		{"Set.Transfer another set's member", "m", true, func() error { return set.Transfer(ctx, other.Members()[0], os.Getpid()) }},
		{"pool.New name", "name", true, func() error { _, err := pool.New(ctx, a, "a pool", pool.Spec{}); return err }},
		{"pool.New name taken", "name", true, func() error { _, err := pool.New(ctx, a, "refused", pool.Spec{}); return err }},
		{"pool.New band", "Spec.Band", true, func() error { _, err := pool.New(ctx, a, "band", pool.Spec{Band: "middle"}); return err }},
		{"pool.New order", "Spec.Order", true, func() error { _, err := pool.New(ctx, a, "order", pool.Spec{Order: "up"}); return err }},
		{"pool.New prefer", "Spec.Prefer[0]", true, func() error { _, err := pool.New(ctx, a, "prefer", pool.Spec{Prefer: []uint16{0}}); return err }},
		{"Pool.Update max unavailable", "Spec.MaxUnavailable", true, func() error { return p.Update(pool.Spec{Size: 1, MaxUnavailable: "-1"}) }},
		{"Pool.Return", "Reservation", true, func() error { return p.Return(held) }},
		{"pool.ParseMaxUnavailable", "max unavailable", true, func() error { _, err := pool.ParseMaxUnavailable("101%", 4); return err }},
		{"fleet.Reserve on SQLite", "Config.StoreDSN", true, func() error {
			_, err := fleet.Reserve(ctx, a, fleet.FleetRequest{Protocol: portalloc.TCP, Band: fleet.Band{First: port, Last: port}, Holder: "pod/x"})
			return err
		}},
		{"fleet.ReserveSet spec", "SetSpec", true, func() error {
			_, err := fleet.ReserveSet(ctx, a, fleet.FleetSetRequest{Spec: badSpec, Band: fleet.Band{First: port, Last: port}, Holder: "pod/x"})
			return err
		}},
		{"fleet.Leases on SQLite", "Config.StoreDSN", true, func() error { _, err := fleet.Leases(ctx, a); return err }},
		{"expvarmetrics.Publish nil", "a", true, func() error { return expvarmetrics.Publish(nil, "refused") }},
		{"expvarmetrics.Publish empty name", "name", true, func() error { return expvarmetrics.Publish(a, "") }},

		// New with a bad Config, and the other constructors.
		{"New mode", "Config.Mode", true, func() error { return newWith(portalloc.Config{Mode: "fast"}) }},
		{"New range", "Config.Range", true, func() error { return newWith(portalloc.Config{Range: portalloc.Range{First: 10, Last: 5}}) }},
		{"New exclude", "Config.Exclude[1]", true, func() error {
			return newWith(portalloc.Config{Exclude: []portalloc.Range{{First: 1, Last: 2}, {First: 0, Last: 5}}})
		}},
		{"New range all excluded", "Config.Range", true, func() error {
			return newWith(portalloc.Config{Range: portalloc.Range{First: 20000, Last: 20010}, Exclude: []portalloc.Range{{First: 20000, Last: 20010}}})
		}},
		{"New order", "Config.Order", true, func() error { return newWith(portalloc.Config{Order: "up"}) }},
		{"New timeout", "Config.Timeout", true, func() error { return newWith(portalloc.Config{Timeout: -time.Second}) }},
		{"New state dir", "Config.StateDir", true, func() error { return newWith(portalloc.Config{StateDir: "a\x00b"}) }},
		{"New store", "Config.StoreDSN", true, func() error { return newWith(portalloc.Config{StoreDSN: "postgres://u:hunter2@db.example/berth"}) }},
		{"New store not a DSN", "Config.StoreDSN", true, func() error { return newWith(portalloc.Config{StoreDSN: "mysql://u:hunter2@db.example/berth"}) }},
		{"New store with mru", "Config.Mode", true, func() error {
			return newWith(portalloc.Config{StoreDSN: "postgres://db.example/berth", Mode: portalloc.ModeMRU})
		}},
		{"NewWithStore nil", "store", true, func() error { _, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: dir}, nil); return err }},
		{"NewWithStore mru", "Config.Mode", true, func() error {
			_, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeMRU}, st)
			return err
		}},
		{"OpenStore store", "Config.StoreDSN", true, func() error {
			_, err := portalloc.OpenStore(ctx, portalloc.Config{StateDir: dir, StoreDSN: "postgres://db.example/berth"})
			return err
		}},

		// Ranges, parsed and checked.
		{"ParseRange", "port range", true, func() error { _, err := portalloc.ParseRange("1-x"); return err }},
		{"ParseRanges", "port range", true, func() error { _, err := portalloc.ParseRanges("1-2,70000"); return err }},
		{"Range.Validate", "port range", false, func() error { return portalloc.Range{First: 9, Last: 1}.Validate() }},
		{"Range.Valid", "port range", false, func() error { return portalloc.Range{First: 9, Last: 1}.Valid() }}, //nolint:staticcheck // the deprecated name still refuses

		// The stores, which have no prefix of portalloc's.
		{"statestore.Open path", "path", false, func() error { _, err := statestore.Open(ctx, "", statestore.Options{}); return err }},
		{"statestore Reserve protocol", "protocol", false, func() error {
			_, err := st.Reserve(ctx, store.Request{Key: store.Key{Protocol: "sctp", Addr: netip.MustParseAddr("127.0.0.1"), Port: port}})
			return err
		}},
		{"statestore Reserve port 0", "port", false, func() error {
			_, err := st.Reserve(ctx, store.Request{Key: store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1")}})
			return err
		}},
		{"mru Allocate protocol", "Request.Protocol", false, func() error { _, err := mf.Allocate(ctx, mru.Request{Protocol: "sctp"}); return err }},
		{"mru Record protocol", "protocol", false, func() error { return mf.Record(ctx, "sctp", port) }},
		{"pgstore.Open DSN", "dsn", false, func() error {
			_, err := pgstore.Open(ctx, "mysql://u:hunter2@db.example/berth", pgstore.Options{Host: "h"})
			return err
		}},
		{"pgstore.Open host", "host", false, func() error {
			_, err := pgstore.Open(ctx, "postgres://db.example/berth", pgstore.Options{Host: "a\x1bb"})
			return err
		}},
		{"pgstore.CheckDSN", "dsn", false, func() error { return pgstore.CheckDSN("POSTGRES://u:hunter2@h/db") }},
	} {
		err := tc.call()
		var fe *portalloc.FieldError
		switch {
		case err == nil:
			t.Errorf("%s = nil; want a *FieldError for %s", tc.name, tc.field)
			continue
		case !errors.As(err, &fe) || fe.Field != tc.field || fe.Want == "":
			t.Errorf("%s = %v; want a *FieldError for %s that says what is accepted", tc.name, err, tc.field)
		case !errors.Is(err, portalloc.ErrInvalidRequest) || !errors.Is(err, store.ErrInvalid):
			t.Errorf("%s = %v; want it to wrap ErrInvalidRequest", tc.name, err)
		}
		msg := err.Error()
		if tc.prefixed && (!strings.HasPrefix(msg, "portalloc: ") || strings.Count(msg, "portalloc: ") != 1) {
			t.Errorf("%s = %q; want one \"portalloc: \" prefix, at the start", tc.name, msg)
		}
		if !tc.prefixed && strings.Contains(msg, "portalloc: ") {
			t.Errorf("%s = %q; want no \"portalloc: \" prefix from a store", tc.name, msg)
		}
		if strings.Contains(msg, "hunter2") {
			t.Errorf("%s = %q; want the password hidden", tc.name, msg)
		}
	}
}

// TestFieldErrorMessage: a refused value reads Field "Value" at At: want
// Want, quoted and cut so that no value floods or forges the line.
func TestFieldErrorMessage(t *testing.T) {
	long := strings.Repeat("a", 100)
	for _, tc := range []struct {
		fe   portalloc.FieldError
		want string
	}{
		{portalloc.FieldError{Field: "Request.Order", Value: "up", Want: `"random" or "lowest"`}, `Request.Order "up": want "random" or "lowest"`},
		{portalloc.FieldError{Field: "BERTH_PORT_EXCLUDE", Value: "1-2,x", At: `item 2 "x"`, Want: "ports"}, `BERTH_PORT_EXCLUDE "1-2,x" at item 2 "x": want ports`},
		{portalloc.FieldError{Field: "label", Value: "a\nb\x1b", Want: "text"}, `label "a\nb\x1b": want text`},
		{portalloc.FieldError{Field: "holder", Value: long, Want: "less"}, `holder "` + long[:64] + `"...: want less`},
		{portalloc.FieldError{Value: "v"}, `"v": not accepted`},
	} {
		if got := tc.fe.Error(); got != tc.want {
			t.Errorf("%#v.Error() = %q; want %q", tc.fe, got, tc.want)
		}
	}
}

// TestOpError: the prefix is the call's, once, and errors.Is and
// errors.As see through it.
func TestOpError(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	_, err := a.Reserve(ctx, portalloc.Request{}, 0)
	var oe *portalloc.OpError
	var fe *portalloc.FieldError
	if !errors.As(err, &oe) || oe.Op != "reserve" || !errors.As(oe.Err, &fe) || fe.Field != "port" {
		t.Fatalf("Reserve(port 0) = %v; want an *OpError for reserve holding a *FieldError for port", err)
	}
	if got, want := err.Error(), "portalloc: reserve: "+fe.Error(); got != want {
		t.Errorf("Reserve(port 0) = %q; want %q", got, want)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = a.Allocate(ctx, portalloc.Request{})
	if !errors.Is(err, portalloc.ErrClosed) || err.Error() != "portalloc: allocate: allocator closed" {
		t.Errorf("Allocate after Close = %v; want \"portalloc: allocate: allocator closed\" wrapping ErrClosed", err)
	}
}
