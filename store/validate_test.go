package store_test

import (
	"errors"
	"math"
	"net/netip"
	"testing"

	"github.com/berth-go/berth/store"
)

// TestCheckRequest: a request is completed (key in normal form, zero
// owner self, zero kind Static) or refused with a *FieldError naming the
// field, the same for every store.
func TestCheckRequest(t *testing.T) {
	self := store.Owner{PID: 42, Start: 7, Scope: "boot"}
	other := store.Owner{PID: 43, Start: 8}
	lease := store.Owner{Scope: store.LeaseScope, Name: "ci/job"}
	k := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("::ffff:127.0.0.1"), Port: 8080}
	norm := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 8080}
	for _, tc := range []struct {
		name  string
		req   store.Request
		want  store.Checked
		field string // refused: the field named
	}{
		{"zero owner and kind", store.Request{Key: k}, store.Checked{Key: norm, Owner: self, Kind: store.Static}, ""},
		{"another owner, dynamic", store.Request{Key: k, Owner: other, Kind: store.Dynamic}, store.Checked{Key: norm, Owner: other, Kind: store.Dynamic}, ""},
		{"a holder under a lease passes", store.Request{Key: k, Owner: lease}, store.Checked{Key: norm, Owner: lease, Kind: store.Static}, ""},
		{"pid 2^31-1", store.Request{Key: k, Owner: store.Owner{PID: math.MaxInt32, Start: 1}}, store.Checked{Key: norm, Owner: store.Owner{PID: math.MaxInt32, Start: 1}, Kind: store.Static}, ""},
		{"pid 2^31", store.Request{Key: k, Owner: store.Owner{PID: math.MaxInt32 + 1, Start: 1}}, store.Checked{}, "owner"},
		{"pid 0 with a start", store.Request{Key: k, Owner: store.Owner{Start: 1}}, store.Checked{}, "owner"},
		{"no start, no scope", store.Request{Key: k, Owner: store.Owner{PID: 5}}, store.Checked{}, "owner"},
		{"kind", store.Request{Key: k, Kind: "sticky"}, store.Checked{}, "kind"},
		{"label", store.Request{Key: k, Label: "a\x1bb"}, store.Checked{}, "label"},
		{"protocol", store.Request{Key: store.Key{Protocol: "sctp", Addr: norm.Addr, Port: 1}}, store.Checked{}, "protocol"},
		{"port 0", store.Request{Key: store.Key{Protocol: store.TCP, Addr: norm.Addr}}, store.Checked{}, "port"},
	} {
		got, err := store.CheckRequest(tc.req, self)
		var fe *store.FieldError
		switch {
		case tc.field == "" && (err != nil || got != tc.want):
			t.Errorf("%s: CheckRequest(%+v) = %+v, %v; want %+v", tc.name, tc.req, got, err, tc.want)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, store.ErrInvalid)):
			t.Errorf("%s: CheckRequest(%+v) = %+v, %v; want a *FieldError for %q", tc.name, tc.req, got, err, tc.field)
		}
	}
}

// TestCheckScan: a scan's key has port 1, its zero kind is Dynamic and its
// zero batch DefaultBatch; a scan with no candidates is refused.
func TestCheckScan(t *testing.T) {
	self := store.Owner{PID: 42, Start: 7}
	next := func() (uint16, bool) { return 0, false }
	addr := netip.MustParseAddr("0.0.0.0")
	got, err := store.CheckScan(store.ScanRequest{Protocol: store.UDP, Addr: addr, Next: next}, self)
	want := store.Checked{Key: store.Key{Protocol: store.UDP, Addr: addr, Port: 1}, Owner: self, Kind: store.Dynamic, Batch: store.DefaultBatch}
	if err != nil || got != want {
		t.Errorf("CheckScan(zero kind and batch) = %+v, %v; want %+v", got, err, want)
	}
	got, err = store.CheckScan(store.ScanRequest{Protocol: store.UDP, Addr: addr, Next: next, Batch: 5, Kind: store.Static}, self)
	if err != nil || got.Batch != 5 || got.Kind != store.Static {
		t.Errorf("CheckScan(batch 5, static) = %+v, %v; want batch 5, kind static", got, err)
	}
	var fe *store.FieldError
	if _, err := store.CheckScan(store.ScanRequest{Protocol: store.UDP, Addr: addr}, self); !errors.As(err, &fe) || fe.Field != "next" {
		t.Errorf("CheckScan(no Next) = %v; want a *FieldError for next", err)
	}
}

// TestCheckBlockAndOwners: the limits and owner checks both stores use.
func TestCheckBlockAndOwners(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, false}, {1, true}, {store.MaxBlock, true}, {store.MaxBlock + 1, false}, {-3, false}} {
		if err := store.CheckBlock(tc.n); (err == nil) != tc.ok {
			t.Errorf("CheckBlock(%d) = %v; want ok %v", tc.n, err, tc.ok)
		}
	}
	lease := store.Owner{Scope: store.LeaseScope, Name: "ci/job"}
	var fe *store.FieldError
	if err := store.CheckProcessOwner(lease); !errors.As(err, &fe) || fe.Field != "owner" {
		t.Errorf("CheckProcessOwner(lease) = %v; want a *FieldError for owner", err)
	}
	if err := store.CheckProcessOwner(store.Owner{}); err != nil {
		t.Errorf("CheckProcessOwner(zero) = %v; want nil", err)
	}
	me, err := store.Self()
	if err != nil {
		t.Fatalf("Self() = %v", err)
	}
	if err := store.CheckOwner(me); err != nil {
		t.Errorf("CheckOwner(Self()) = %v; want nil", err)
	}
	if err := store.CheckOwner(lease); err == nil {
		t.Errorf("CheckOwner(lease) = nil; want an error: a lease is no process")
	}
}

// TestRangeIsOneType: store.Range's Valid refuses with a *FieldError
// wrapping ErrInvalid, the error every name of the type returns.
func TestRangeIsOneType(t *testing.T) {
	err := store.Range{First: 10, Last: 5}.Validate()
	var fe *store.FieldError
	if !errors.As(err, &fe) || !errors.Is(err, store.ErrInvalid) || fe.Field != "port range" || fe.Value != "10-5" || fe.Want == "" {
		t.Errorf("Range{10, 5}.Validate() = %v; want a *FieldError for the port range 10-5 wrapping ErrInvalid", err)
	}
	if r := (store.Range{First: 20000, Last: 20009}); r.Size() != 10 || !r.Contains(20009) || r.String() != "20000-20009" {
		t.Errorf("Range{20000, 20009}: Size %d, Contains(20009) %v, String %q; want 10, true, 20000-20009", r.Size(), r.Contains(20009), r.String())
	}
}

// TestLeaseValidate: a lease is refused for its holder or its TTL with a
// *FieldError naming the field; the deprecated Check says the same.
func TestLeaseValidate(t *testing.T) {
	for _, tt := range []struct {
		l         store.Lease
		wantField string // "" for nil
	}{
		{store.Lease{Holder: "ci/job-1", TTL: store.MinLeaseTTL}, ""},
		{store.Lease{Holder: "", TTL: store.MinLeaseTTL}, "holder"},
		{store.Lease{Holder: "ci/job-1", TTL: store.MaxLeaseTTL + 1}, "ttl"},
	} {
		err := tt.l.Validate()
		var fe *store.FieldError
		switch {
		case tt.wantField == "" && err != nil:
			t.Errorf("%+v.Validate() = %v; want nil", tt.l, err)
		case tt.wantField != "" && (!errors.As(err, &fe) || fe.Field != tt.wantField):
			t.Errorf("%+v.Validate() = %v; want a *FieldError for %q", tt.l, err, tt.wantField)
		}
		if old := tt.l.Check(); (old == nil) != (err == nil) { //nolint:staticcheck // the deprecated name must agree
			t.Errorf("%+v.Check() = %v; want what Validate says, %v", tt.l, old, err)
		}
	}
}
