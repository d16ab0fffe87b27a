package portalloc_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// refusal is one call given input it must refuse: field is the Field of
// the *store.FieldError its error must hold.
type refusal struct {
	name  string
	field string
	call  func() error
}

// TestRefusedInput: every kind of bad input the public calls of portalloc
// and of the packages over it take is refused with one shape: an error
// that errors.As finds a *store.FieldError in, naming the field and saying
// what is accepted, that wraps store.ErrInvalid, and that carries
// portalloc's prefix exactly once; nothing is reserved.
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
		cfg.IgnoreEnv = true
		b, err := portalloc.New(ctx, cfg)
		if err == nil {
			_ = b.Close()
		}
		return err
	}
	req := func(r portalloc.Request) func() error {
		return func() error { _, err := a.Allocate(ctx, r); return err }
	}
	tooMany := make([]uint16, portalloc.MaxPrefer+1)
	for i := range tooMany {
		tooMany[i] = uint16(20000 + i)
	}
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
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: a.Config().StateDir})
	p, err := pool.New(ctx, a, "refused", pool.Spec{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	badSpec := portset.SetSpec{Name: "refused", Groups: []portset.GroupSpec{{Name: "api", Ports: []portset.PortSpec{{Name: "http", Order: "highest"}}}}}
	lease := portalloc.Request{Holder: "ci/refused", TTL: time.Minute}
	open := func(ctx context.Context, _ portalloc.Config) (store.Store, error) {
		return statestore.Open(ctx, t.TempDir()+"/berth.db", statestore.Options{SweepInterval: -1})
	}
	before := len(storeRows(t, a.Config().StateDir, store.Filter{}))

	for _, tc := range []refusal{
		// Allocate and the calls that share its request checks.
		{"Allocate protocol", "Request.Protocol", req(portalloc.Request{Protocol: "sctp"})},
		{"Allocate zoned address", "Request.Addr", req(portalloc.Request{Addr: netip.MustParseAddr("fe80::1%eth0")})},
		{"Allocate order", "Request.Order", req(portalloc.Request{Order: "highest"})},
		{"Allocate too many preferred", "Request.Prefer", req(portalloc.Request{Prefer: tooMany})},
		{"Allocate preferred 0", "Request.Prefer[1]", req(portalloc.Request{Prefer: []uint16{port, 0}})},
		{"Allocate label", "Request.Label", req(portalloc.Request{Label: "x\x1b]0;t\a"})},
		{"Allocate sticky without label", "Request.Label", req(portalloc.Request{Sticky: true})},
		{"Allocate foreign address", "Request.Addr", req(portalloc.Request{Addr: netip.MustParseAddr("192.0.2.7")})},
		{"Allocate within outside the range", "Request.Within", req(portalloc.Request{Within: store.Range{First: 1024, Last: 2000}})},
		{"Allocate within backwards", "Request.Within", req(portalloc.Request{Within: store.Range{First: allocRange.Last, Last: allocRange.First}})},
		{"Allocate holder without a lease", "Request.TTL", req(portalloc.Request{Holder: "ci/x"})},
		{"Allocate lease without a holder", "Request.Holder", req(portalloc.Request{TTL: time.Minute})},
		{"Allocate holder with an escape", "Request.Holder", req(portalloc.Request{Holder: "ci/\x1b[2J", TTL: time.Minute})},
		{"Allocate lease too long", "Request.TTL", req(portalloc.Request{Holder: "ci/x", TTL: 10000 * time.Hour})},
		{"Allocate lease too short", "Request.TTL", req(portalloc.Request{Holder: "ci/x", TTL: time.Millisecond})},
		{"Reserve port 0", "port", func() error { _, err := a.Reserve(ctx, portalloc.Request{}, 0); return err }},
		{"Reserve protocol", "Request.Protocol", func() error { _, err := a.Reserve(ctx, portalloc.Request{Protocol: "x"}, port); return err }},
		{"Reserve for a holder port 0", "port", func() error { _, err := a.Reserve(ctx, lease, 0); return err }},
		{"AllocateBlock of 0", "n", func() error { _, err := a.AllocateBlock(ctx, portalloc.Request{}, 0); return err }},
		{"AllocateBlock too long", "n", func() error { _, err := a.AllocateBlock(ctx, portalloc.Request{}, store.MaxBlock+1); return err }},
		{"AllocateBlock sticky", "Request.Sticky", func() error {
			_, err := a.AllocateBlock(ctx, portalloc.Request{Label: "b", Sticky: true}, 2)
			return err
		}},
		{"Renew ttl", "ttl", func() error { _, err := a.Renew(ctx, "ci/x", 0); return err }},
		{"Renew holder", "holder", func() error { _, err := a.Renew(ctx, "", time.Minute); return err }},
		{"ReleaseHolder holder", "holder", func() error { _, err := a.ReleaseHolder(ctx, "", store.Filter{}); return err }},
		{"ReleaseHolder label", "Filter.Label", func() error { _, err := a.ReleaseHolder(ctx, "ci/x", store.Filter{Label: "\x1b"}); return err }},
		{"ReleaseHolder filter of a holder", "Filter", func() error { _, err := a.ReleaseHolder(ctx, "ci/x", store.Filter{Holder: "ci/y"}); return err }},
		{"ReleaseHolder filter of a pid", "Filter", func() error { _, err := a.ReleaseHolder(ctx, "ci/x", store.Filter{OwnerPID: 1}); return err }},
		{"Listen udp", "Request.Protocol", func() error { _, _, err := a.Listen(ctx, portalloc.Request{Protocol: store.UDP}); return err }},
		{"ListenPacket tcp", "Request.Protocol", func() error {
			_, _, err := a.ListenPacket(ctx, portalloc.Request{Protocol: store.TCP})
			return err
		}},
		{"Release of the zero Reservation", "protocol", func() error { return a.Release(ctx, store.Reservation{}) }},
		{"Release of another Allocator's", "Reservation", func() error { return b.Release(ctx, held) }},
		{"Transfer to no process", "pid", func() error { return a.Transfer(ctx, held, -1) }},
		{"Transfer of a row held twice", "Reservation", func() error { return a.Transfer(ctx, twice, os.Getpid()) }},
		{"Transfer of another Allocator's", "Reservation", func() error { return b.Transfer(ctx, held, os.Getpid()) }},

		// Sets, pools and metrics: the packages over an Allocator.
		{"ParseSetSpec JSON", "SetSpec", func() error { _, err := portset.ParseSetSpec([]byte(`{"name": 1}`)); return err }},
		{"ParseSetSpec unknown key", "SetSpec", func() error { _, err := portset.ParseSetSpec([]byte(`{"nmae": "x"}`)); return err }},
		{"SetSpec.Validate", "SetSpec", badSpec.Validate},
		{"SetSpec.ValidateOneEnv", "SetSpec", badSpec.ValidateOneEnv},
		{"portset.Allocate", "SetSpec", func() error { _, err := portset.Allocate(ctx, a, badSpec); return err }},
		{"Set.Member group", "group", func() error { _, err := set.Member("web", 0); return err }},
		{"Set.Member index", "index", func() error { _, err := set.Member("api", 1); return err }},
		{"Set.Transfer nil", "m", func() error { return set.Transfer(ctx, nil, os.Getpid()) }},
		{"Set.Transfer another set's member", "m", func() error { return set.Transfer(ctx, other.Members()[0], os.Getpid()) }},
		{"pool.New name", "name", func() error { _, err := pool.New(ctx, a, "a pool", pool.Spec{}); return err }},
		{"pool.New name taken", "name", func() error { _, err := pool.New(ctx, a, "refused", pool.Spec{}); return err }},
		{"pool.New segment", "Spec.Segment", func() error { _, err := pool.New(ctx, a, "segment", pool.Spec{Segment: "middle"}); return err }},
		{"pool.New order", "Spec.Order", func() error { _, err := pool.New(ctx, a, "order", pool.Spec{Order: "up"}); return err }},
		{"pool.New prefer", "Spec.Prefer[0]", func() error { _, err := pool.New(ctx, a, "prefer", pool.Spec{Prefer: []uint16{0}}); return err }},
		{"Pool.Update max unavailable", "Spec.MaxUnavailable", func() error { return p.Update(pool.Spec{Size: 1, MaxUnavailable: "-1"}) }},
		{"Pool.Return", "Reservation", func() error { return p.Return(held) }},
		{"pool.ParseMaxUnavailable", "max unavailable", func() error { _, err := pool.ParseMaxUnavailable("101%", 4); return err }},
		{"expvarmetrics.Publish nil", "a", func() error { return expvarmetrics.Publish(nil, "refused") }},
		{"expvarmetrics.Publish empty name", "name", func() error { return expvarmetrics.Publish(a, "") }},
		{"fleet.Open without a store", "Config.StoreDSN", func() error {
			s, err := fleet.Open(ctx, portalloc.Config{StateDir: dir, IgnoreEnv: true})
			if err == nil {
				_ = s.Close()
			}
			return err
		}},
		{"fleet.SetRequests spec", "SetSpec", func() error {
			_, err := fleet.SetRequests(badSpec, store.Range{First: port, Last: port}, "pod/x", time.Minute)
			return err
		}},

		// New with a bad Config, and the other constructors.
		{"New mode", "Config.Mode", func() error { return newWith(portalloc.Config{Mode: "fast"}) }},
		{"New range", "Config.Range", func() error { return newWith(portalloc.Config{Range: store.Range{First: 10, Last: 5}}) }},
		{"New privileged range", "Config.Range", func() error { return newWith(portalloc.Config{Range: store.Range{First: 80, Last: 2000}}) }},
		{"New exclude", "Config.Exclude[1]", func() error {
			return newWith(portalloc.Config{Exclude: []store.Range{{First: 1, Last: 2}, {First: 0, Last: 5}}})
		}},
		{"New range all excluded", "Config.Range", func() error {
			return newWith(portalloc.Config{Range: store.Range{First: 20000, Last: 20010}, Exclude: []store.Range{{First: 20000, Last: 20010}}})
		}},
		{"New order", "Config.Order", func() error { return newWith(portalloc.Config{Order: "up"}) }},
		{"New timeout", "Config.Timeout", func() error { return newWith(portalloc.Config{Timeout: -time.Second}) }},
		{"New state dir", "Config.StateDir", func() error { return newWith(portalloc.Config{StateDir: "a\x00b"}) }},
		{"New scope", "Config.Scope", func() error { return newWith(portalloc.Config{Scope: "git:main"}) }},
		{"New store", "Config.StoreDSN", func() error { return newWith(portalloc.Config{StoreDSN: "postgres://u:hunter2@db.example/berth"}) }},
		{"New store not a DSN", "Config.StoreDSN", func() error { return newWith(portalloc.Config{StoreDSN: "mysql://u:hunter2@db.example/berth"}) }},
		{"New store with mru", "Config.Mode", func() error {
			return newWith(portalloc.Config{StoreDSN: "postgres://db.example/berth", Mode: portalloc.ModeMRU})
		}},
		{"NewWithStore nil", "open", func() error { _, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: dir}, nil); return err }},
		{"NewWithStore mru", "Config.Mode", func() error {
			_, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeMRU, IgnoreEnv: true}, open)
			return err
		}},
	} {
		err := tc.call()
		var fe *store.FieldError
		switch {
		case err == nil:
			t.Errorf("%s = nil; want a *FieldError for %s", tc.name, tc.field)
			continue
		case !errors.As(err, &fe) || fe.Field != tc.field || fe.Want == "":
			t.Errorf("%s = %v; want a *FieldError for %s that says what is accepted", tc.name, err, tc.field)
		case !errors.Is(err, store.ErrInvalid):
			t.Errorf("%s = %v; want it to wrap ErrInvalid", tc.name, err)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "portalloc: ") || strings.Count(msg, "portalloc: ") != 1 {
			t.Errorf("%s = %q; want one \"portalloc: \" prefix, at the start", tc.name, msg)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s = %q; want the password hidden", tc.name, err)
		}
	}
	if after := len(storeRows(t, a.Config().StateDir, store.Filter{})); after != before {
		t.Errorf("the store has %d rows after the refused calls, %d before; want the same", after, before)
	}
	if !holdsPort(a, held.Port) || !holdsPort(a, twice.Port) {
		t.Errorf("Held() = %v; want %v and %v still", a.Held(), held, twice)
	}
}

// TestOpError: the prefix is the call's, once, and errors.Is and
// errors.As see through it.
func TestOpError(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	_, err := a.Reserve(ctx, portalloc.Request{}, 0)
	var oe *portalloc.OpError
	var fe *store.FieldError
	if !errors.As(err, &oe) || oe.Op != "reserve" || !errors.As(oe.Err, &fe) || fe.Field != "port" {
		t.Fatalf("Reserve(port 0) = %v; want an *OpError for reserve holding a *FieldError for port", err)
	}
	if got, want := err.Error(), "portalloc: reserve: "+fe.Error(); got != want {
		t.Errorf("Reserve(port 0) = %q; want %q", got, want)
	}
	_, err = portalloc.New(ctx, portalloc.Config{Mode: "fast", IgnoreEnv: true})
	if !errors.As(err, &oe) || oe.Op != "" || err.Error() != `portalloc: Config.Mode "fast": want "statestore", "statestore-with-fallback" or "mru"` {
		t.Errorf("New(Mode fast) = %v; want an *OpError of no call, prefixed once", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = a.Allocate(ctx, portalloc.Request{})
	if !errors.Is(err, store.ErrClosed) || err.Error() != "portalloc: allocate: closed" {
		t.Errorf("Allocate after Close = %v; want \"portalloc: allocate: closed\" wrapping ErrClosed", err)
	}
}
