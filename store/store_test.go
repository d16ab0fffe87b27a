package store_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/berth-go/berth/store"
)

func TestKeyNormalize(t *testing.T) {
	ok := []struct {
		in   store.Key
		want netip.Addr
	}{
		{store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 1}, netip.MustParseAddr("127.0.0.1")},
		{store.Key{Protocol: store.UDP, Addr: netip.MustParseAddr("::ffff:127.0.0.1"), Port: 65535}, netip.MustParseAddr("127.0.0.1")},
		{store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("::"), Port: 80}, netip.MustParseAddr("::")},
	}
	for _, tc := range ok {
		got, err := tc.in.Normalize()
		if err != nil || got.Addr != tc.want {
			t.Errorf("%v.Normalize() = %v, %v; want address %v", tc.in, got, err, tc.want)
		}
	}
	bad := []struct {
		in    store.Key
		field string
	}{
		{store.Key{Protocol: "sctp", Addr: netip.MustParseAddr("127.0.0.1"), Port: 1}, "protocol"},
		{store.Key{Protocol: "", Addr: netip.MustParseAddr("127.0.0.1"), Port: 1}, "protocol"},
		{store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 0}, "port"},
		{store.Key{Protocol: store.TCP, Port: 1}, "address"},
		{store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("fe80::1%eth0"), Port: 1}, "address"},
	}
	for _, tc := range bad {
		_, err := tc.in.Normalize()
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%v.Normalize() = %v; want a *FieldError for %q wrapping ErrInvalid", tc.in, err, tc.field)
		}
	}
}

func TestKeyConflicts(t *testing.T) {
	k := func(proto store.Protocol, addr string, port uint16) store.Key {
		return store.Key{Protocol: proto, Addr: netip.MustParseAddr(addr), Port: port}
	}
	tests := []struct {
		a, b store.Key
		want bool
	}{
		{k(store.TCP, "127.0.0.1", 1), k(store.TCP, "127.0.0.1", 1), true},
		{k(store.TCP, "127.0.0.1", 1), k(store.TCP, "127.0.0.2", 1), false},
		{k(store.TCP, "0.0.0.0", 1), k(store.TCP, "127.0.0.2", 1), true},
		{k(store.TCP, "::", 1), k(store.TCP, "127.0.0.2", 1), true},
		{k(store.TCP, "::1", 1), k(store.TCP, "0.0.0.0", 1), true},
		{k(store.TCP, "::1", 1), k(store.TCP, "127.0.0.1", 1), false},
		{k(store.TCP, "::", 1), k(store.TCP, "::1", 1), true},
		{k(store.TCP, "127.0.0.1", 1), k(store.UDP, "127.0.0.1", 1), false},
		{k(store.TCP, "127.0.0.1", 1), k(store.TCP, "127.0.0.1", 2), false},
	}
	for _, tc := range tests {
		if got := tc.a.Conflicts(tc.b); got != tc.want {
			t.Errorf("%v.Conflicts(%v) = %v; want %v", tc.a, tc.b, got, tc.want)
		}
		if got := tc.b.Conflicts(tc.a); got != tc.want {
			t.Errorf("%v.Conflicts(%v) = %v; want %v", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestConflictError(t *testing.T) {
	key := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 20001}
	any4 := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("0.0.0.0"), Port: 20001}
	tests := []struct {
		err  store.ConflictError
		want []string
		not  []string
	}{
		{store.ConflictError{Key: key, Bound: true}, []string{"tcp 127.0.0.1:20001 is bound by a process outside berth"}, nil},
		{store.ConflictError{Key: key}, []string{"tcp 127.0.0.1:20001 is locked by another process of this host, which holds tcp 127.0.0.1:20001 without a reservation"}, []string{"invalid"}},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: any4}, PIDs: []int{42, 43}},
			[]string{"locked by pid 42, 43, which holds tcp 0.0.0.0:20001 without a reservation", "berth who 20001"}, nil},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: key, Owner: store.Owner{PID: 7}, Label: "api"}, Self: true},
			[]string{"already reserved by this process", `(label "api")`}, nil},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: any4, Owner: store.Owner{PID: 7}}, Self: true},
			[]string{"own reservation of tcp 0.0.0.0:20001"}, nil},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: any4, Owner: store.Owner{PID: 42, Name: "web"}}},
			[]string{"held by pid 42 (web) through its reservation of tcp 0.0.0.0:20001"}, nil},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: key, Owner: store.Owner{PID: 42, Name: "x\x1b]0;pwned\x07"}, Label: "a\nb"}},
			[]string{`pid 42 ("x\x1b]0;pwned\a")`, `(label "a\nb")`}, []string{"\x1b", "\n"}},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: key, Owner: store.Owner{PID: 42, Name: strings.Repeat("n", 1000)}}},
			[]string{"..."}, []string{strings.Repeat("n", 65)}},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: any4, Owner: store.Owner{Holder: "pod/default/web-0"}}},
			[]string{`held by holder "pod/default/web-0" through its reservation of tcp 0.0.0.0:20001`}, []string{"outside berth", "pid 0"}},
		{store.ConflictError{Key: key, Holder: store.Reservation{Key: key, Owner: store.Owner{Holder: "p\x1b" + strings.Repeat("n", 1000)}}},
			[]string{`holder "p\x1b`, "..."}, []string{strings.Repeat("n", 65), "\x1b"}},
	}
	for _, tc := range tests {
		msg := tc.err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("Error() = %q; want it to contain %q", msg, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(msg, n) {
				t.Errorf("Error() = %q; want no %q in it", msg, n)
			}
		}
		if !errors.Is(&tc.err, store.ErrHeld) {
			t.Errorf("errors.Is(%q, ErrHeld) = false; want true", msg)
		}
	}
}

func TestFieldErrorCutsLongValues(t *testing.T) {
	err := &store.FieldError{Field: "label", Value: strings.Repeat("x", 1<<20), Want: "something shorter"}
	msg := err.Error()
	if len(msg) > 200 || !strings.Contains(msg, `"`+strings.Repeat("x", 64)+`"...`) {
		t.Errorf("Error() of a 1 MiB value = %d bytes (%.100q...); want the first 64 bytes quoted and cut", len(msg), msg)
	}
	short := &store.FieldError{Field: "label", Value: "a\x1bb", Want: "printable"}
	if got, want := short.Error(), `label "a\x1bb": want printable`; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
}

// TestSentinelsDistinct: every sentinel is its own condition: none is
// another, so a caller that branches on one (portalloc falls back on
// ErrStorage, waits on ErrBusy, asks again on ErrGrace) never mistakes
// it for another.
func TestSentinelsDistinct(t *testing.T) {
	all := map[string]error{
		"ErrInvalid": store.ErrInvalid, "ErrHeld": store.ErrHeld, "ErrExhausted": store.ErrExhausted,
		"ErrNotFound": store.ErrNotFound, "ErrClosed": store.ErrClosed, "ErrUnavailable": store.ErrUnavailable,
		"ErrDamaged": store.ErrDamaged, "ErrSchemaTooNew": store.ErrSchemaTooNew, "ErrBusy": store.ErrBusy,
		"ErrUnsafe": store.ErrUnsafe, "ErrLost": store.ErrLost, "ErrGrace": store.ErrGrace,
		"ErrTransient": store.ErrTransient, "ErrStorage": store.ErrStorage,
	}
	msgs := map[string]string{}
	for name, err := range all {
		if err == nil || err.Error() == "" {
			t.Errorf("%s = %v; want an error with a message", name, err)
			continue
		}
		if other, dup := msgs[err.Error()]; dup {
			t.Errorf("%s and %s read the same: %q", name, other, err)
		}
		msgs[err.Error()] = name
		for other, target := range all {
			if other != name && errors.Is(err, target) {
				t.Errorf("errors.Is(%s, %s) = true; want every sentinel distinct", name, other)
			}
		}
	}
	wrapped := fmt.Errorf("reserve tcp 127.0.0.1:80: %w", store.ErrGrace)
	if !errors.Is(wrapped, store.ErrGrace) || errors.Is(wrapped, store.ErrUnavailable) || errors.Is(wrapped, store.ErrStorage) {
		t.Errorf("a wrapped ErrGrace: Is(ErrGrace) %v, Is(ErrUnavailable) %v, Is(ErrStorage) %v; want true, false, false",
			errors.Is(wrapped, store.ErrGrace), errors.Is(wrapped, store.ErrUnavailable), errors.Is(wrapped, store.ErrStorage))
	}
}
