package store_test

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/berth-go/berth/store"
)

// TestRequestValidate: a request is completed (key in normal form, zero
// owner self, zero kind Static) or refused with a *FieldError naming the
// field, the same for every store.
func TestRequestValidate(t *testing.T) {
	self := store.Owner{PID: 42, Start: 7, Namespace: "boot"}
	other := store.Owner{PID: 43, Start: 8}
	holder := store.Owner{Holder: "ci/job"}
	k := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("::ffff:127.0.0.1"), Port: 8080}
	norm := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 8080}
	type want struct {
		key   store.Key
		owner store.Owner
		kind  store.Kind
	}
	for _, tc := range []struct {
		name  string
		req   store.Request
		want  want
		field string // refused: the field named
	}{
		{"zero owner and kind", store.Request{Key: k}, want{norm, self, store.Static}, ""},
		{"another owner, dynamic", store.Request{Key: k, Owner: other, Kind: store.Dynamic}, want{norm, other, store.Dynamic}, ""},
		{"a holder with a lease", store.Request{Key: k, Owner: holder, TTL: time.Minute}, want{norm, holder, store.Static}, ""},
		{"a holder without a lease", store.Request{Key: k, Owner: holder}, want{}, "ttl"},
		{"a holder with a lease over MaxTTL", store.Request{Key: k, Owner: holder, TTL: store.MaxTTL + 1}, want{}, "ttl"},
		{"a process with a lease", store.Request{Key: k, TTL: time.Minute}, want{}, "ttl"},
		{"a holder and a pid", store.Request{Key: k, Owner: store.Owner{PID: 5, Start: 1, Holder: "x"}, TTL: time.Minute}, want{}, "owner"},
		{"a holder of control characters", store.Request{Key: k, Owner: store.Owner{Holder: "a\x1bb"}, TTL: time.Minute}, want{}, "holder"},
		{"pid 2^31-1", store.Request{Key: k, Owner: store.Owner{PID: math.MaxInt32, Start: 1}}, want{norm, store.Owner{PID: math.MaxInt32, Start: 1}, store.Static}, ""},
		{"pid 2^31", store.Request{Key: k, Owner: store.Owner{PID: math.MaxInt32 + 1, Start: 1}}, want{}, "owner"},
		{"pid 0 with a start", store.Request{Key: k, Owner: store.Owner{Start: 1}}, want{}, "owner"},
		{"no start, no namespace", store.Request{Key: k, Owner: store.Owner{PID: 5}}, want{}, "owner"},
		{"kind", store.Request{Key: k, Kind: "sticky"}, want{}, "kind"},
		{"label", store.Request{Key: k, Label: "a\x1bb"}, want{}, "label"},
		{"protocol", store.Request{Key: store.Key{Protocol: "sctp", Addr: norm.Addr, Port: 1}}, want{}, "protocol"},
		{"port 0", store.Request{Key: store.Key{Protocol: store.TCP, Addr: norm.Addr}}, want{}, "port"},
	} {
		got, err := tc.req.Validate(self)
		var fe *store.FieldError
		switch {
		case tc.field == "" && (err != nil || got.Key != tc.want.key || got.Owner != tc.want.owner || got.Kind != tc.want.kind):
			t.Errorf("%s: Validate(%+v) = %+v, %v; want %+v", tc.name, tc.req, got, err, tc.want)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, store.ErrInvalid)):
			t.Errorf("%s: Validate(%+v) = %+v, %v; want a *FieldError for %q", tc.name, tc.req, got, err, tc.field)
		}
	}
}

// TestScanRequestValidate: a scan's zero kind is Dynamic and its zero batch
// 32; a scan with no candidates is refused.
func TestScanRequestValidate(t *testing.T) {
	self := store.Owner{PID: 42, Start: 7}
	next := func() (uint16, bool) { return 0, false }
	addr := netip.MustParseAddr("0.0.0.0")
	got, err := store.ScanRequest{Protocol: store.UDP, Addr: addr, Next: next}.Validate(self)
	if err != nil || got.Owner != self || got.Kind != store.Dynamic || got.Batch != 32 || got.Addr != addr {
		t.Errorf("Validate(zero kind and batch) = %+v, %v; want owner self, kind dynamic, batch 32", got, err)
	}
	got, err = store.ScanRequest{Protocol: store.UDP, Addr: addr, Next: next, Batch: 5, Kind: store.Static}.Validate(self)
	if err != nil || got.Batch != 5 || got.Kind != store.Static {
		t.Errorf("Validate(batch 5, static) = %+v, %v; want batch 5, kind static", got, err)
	}
	var fe *store.FieldError
	if _, err := (store.ScanRequest{Protocol: store.UDP, Addr: addr}).Validate(self); !errors.As(err, &fe) || fe.Field != "next" {
		t.Errorf("Validate(no Next) = %v; want a *FieldError for next", err)
	}
	if _, err := (store.ScanRequest{Protocol: store.UDP, Next: next}).Validate(self); !errors.As(err, &fe) || fe.Field != "address" {
		t.Errorf("Validate(no address) = %v; want a *FieldError for address", err)
	}
}

// TestRangeValidate: an invalid range is refused with a *FieldError
// wrapping ErrInvalid.
func TestRangeValidate(t *testing.T) {
	err := store.Range{First: 10, Last: 5}.Validate()
	var fe *store.FieldError
	if !errors.As(err, &fe) || !errors.Is(err, store.ErrInvalid) || fe.Field != "port range" || fe.Value != "10-5" || fe.Want == "" {
		t.Errorf("Range{10, 5}.Validate() = %v; want a *FieldError for the port range 10-5 wrapping ErrInvalid", err)
	}
	if r := (store.Range{First: 20000, Last: 20009}); r.Size() != 10 || !r.Contains(20009) || r.String() != "20000-20009" {
		t.Errorf("Range{20000, 20009}: Size %d, Contains(20009) %v, String %q; want 10, true, 20000-20009", r.Size(), r.Contains(20009), r.String())
	}
}

// TestCheckTTL: a lease from MinTTL to MaxTTL.
func TestCheckTTL(t *testing.T) {
	for _, tc := range []struct {
		ttl time.Duration
		ok  bool
	}{{store.MinTTL, true}, {store.MaxTTL, true}, {store.MinTTL - 1, false}, {store.MaxTTL + 1, false}, {0, false}, {-time.Second, false}} {
		err := store.CheckTTL(tc.ttl)
		var fe *store.FieldError
		if (err == nil) != tc.ok || (err != nil && (!errors.As(err, &fe) || fe.Field != "ttl")) {
			t.Errorf("CheckTTL(%v) = %v; want ok %v", tc.ttl, err, tc.ok)
		}
	}
}

// TestOwners: Self and LookupOwner name live processes the same way, an
// exited one is not alive, and a holder is alive until its lease ends
// (told by the reservation, not the owner).
func TestOwners(t *testing.T) {
	ctx := context.Background()
	me, err := store.Self()
	if err != nil {
		t.Fatalf("Self() = %v", err)
	}
	if me.PID != os.Getpid() || me.Validate() != nil || !me.Alive(ctx) {
		t.Fatalf("Self() = %+v (valid: %v); want this live process", me, me.Validate())
	}
	looked, err := store.LookupOwner(ctx, os.Getpid())
	if err != nil || !looked.Same(me) {
		t.Errorf("LookupOwner(self) = %+v, %v; want the same owner as Self, %+v", looked, err, me)
	}
	if _, ok := me.StartedAt(); !ok {
		t.Logf("StartedAt unknown on this system")
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child, err := store.LookupOwner(ctx, cmd.Process.Pid)
	if err != nil {
		t.Fatalf("LookupOwner(child) = %v", err)
	}
	_ = cmd.Wait()
	if child.Alive(ctx) {
		t.Errorf("%v.Alive after it exited = true; want false", child)
	}
	if _, err := store.LookupOwner(ctx, cmd.Process.Pid); err == nil {
		t.Logf("pid %d was reused already", cmd.Process.Pid)
	}
	var fe *store.FieldError
	if _, err := store.LookupOwner(ctx, 0); !errors.As(err, &fe) || fe.Field != "pid" {
		t.Errorf("LookupOwner(0) = %v; want a *FieldError for pid", err)
	}
	if _, err := store.LookupOwner(ctx, -1); !errors.As(err, &fe) || fe.Field != "pid" {
		t.Errorf("LookupOwner(-1) = %v; want a *FieldError for pid", err)
	}

	holder := store.Owner{Holder: "ci/job-1"}
	if holder.Same(me) || me.Same(holder) || !holder.Same(store.Owner{Holder: "ci/job-1"}) {
		t.Errorf("Same: a holder and a process must differ, two holders of one name agree")
	}
	if err := holder.Validate(); err != nil {
		t.Errorf("%v.Validate() = %v; want nil", holder, err)
	}
	r := store.Reservation{Owner: holder, Expires: time.Now().Add(time.Minute)}
	if !r.Live(ctx) {
		t.Errorf("a holder's reservation with a lease ahead: Live = false; want true")
	}
	r.Expires = time.Now().Add(-time.Second)
	if r.Live(ctx) {
		t.Errorf("a holder's reservation whose lease ended: Live = true; want false")
	}
}
