package netaddr_test

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/berth-go/berth/internal/netaddr"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{"127.0.0.1", "127.0.0.1", false},
		{"0.0.0.0", "0.0.0.0", false},
		{"::", "::", false},
		{"::1", "::1", false},
		{"::ffff:127.0.0.1", "127.0.0.1", false},
		{"::ffff:0.0.0.0", "0.0.0.0", false},
		{"2001:db8::1", "2001:db8::1", false},
		{"fe80::1%eth0", "", true},
		{"", "", true},
		{"localhost", "", true},
		{"127.0.0.1:80", "", true},
		{"256.0.0.1", "", true},
	}
	for _, tt := range tests {
		got, err := netaddr.Parse(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("Parse(%q) = %v, nil; want error", tt.in, got)
			} else if !errors.Is(err, netaddr.ErrInvalid) {
				t.Errorf("Parse(%q) error %v does not wrap ErrInvalid", tt.in, err)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("Parse(%q) = %v, %v; want %s, nil", tt.in, got, err, tt.want)
		}
	}
}

func TestParseErrorNamesInput(t *testing.T) {
	_, err := netaddr.Parse("fe80::1%eth0")
	var ae *netaddr.AddrError
	if !errors.As(err, &ae) || ae.Input != "fe80::1%eth0" {
		t.Fatalf("Parse(zoned) error = %v; want *AddrError naming the input", err)
	}
}

func TestNormalizeZero(t *testing.T) {
	if _, err := netaddr.Normalize(netip.Addr{}); !errors.Is(err, netaddr.ErrInvalid) {
		t.Errorf("Normalize(zero) error = %v; want ErrInvalid", err)
	}
}

func TestPack(t *testing.T) {
	tests := []struct {
		in   string
		want []byte
	}{
		{"127.0.0.1", []byte{127, 0, 0, 1}},
		{"0.0.0.0", []byte{0, 0, 0, 0}},
		{"::ffff:10.1.2.3", []byte{10, 1, 2, 3}},
		{"::", make([]byte, 16)},
		{"::1", append(make([]byte, 15), 1)},
	}
	for _, tt := range tests {
		got, err := netaddr.Pack(netip.MustParseAddr(tt.in))
		if err != nil || !bytes.Equal(got, tt.want) {
			t.Errorf("Pack(%s) = %x, %v; want %x", tt.in, got, err, tt.want)
		}
	}
}

func TestUnpackRejects(t *testing.T) {
	mapped := netip.MustParseAddr("::ffff:127.0.0.1").As16()
	for _, b := range [][]byte{nil, {1, 2, 3}, make([]byte, 5), make([]byte, 17), mapped[:]} {
		if a, err := netaddr.Unpack(b); err == nil {
			t.Errorf("Unpack(%x) = %v, nil; want error", b, a)
		}
	}
}

// TestConflicts walks the whole rule matrix over representative addresses
// of each class.
func TestConflicts(t *testing.T) {
	const (
		v4any  = "0.0.0.0"
		v4lo   = "127.0.0.1"
		v4lo2  = "127.0.0.2"
		v6any  = "::"
		v6lo   = "::1"
		v6glob = "2001:db8::1"
	)
	tests := []struct {
		a, b string
		want bool
	}{
		// equal addresses
		{v4any, v4any, true},
		{v4lo, v4lo, true},
		{v6any, v6any, true},
		{v6lo, v6lo, true},
		// IPv4 wildcard against IPv4
		{v4any, v4lo, true},
		{v4any, v4lo2, true},
		// distinct specific IPv4
		{v4lo, v4lo2, false},
		// IPv6 wildcard against everything
		{v6any, v4any, true},
		{v6any, v4lo, true},
		{v6any, v6lo, true},
		{v6any, v6glob, true},
		// IPv4 wildcard covers IPv6 specifics: Go binds 0.0.0.0 dual-stack,
		// and Linux refuses non-V6ONLY IPv6 sockets beside it
		{v4any, v6lo, true},
		{v4any, v6glob, true},
		// specific IPv6 against IPv4
		{v6lo, v4lo, false},
		{v6glob, v4lo, false},
		// distinct specific IPv6
		{v6lo, v6glob, false},
	}
	for _, tt := range tests {
		a, b := netaddr.MustParse(tt.a), netaddr.MustParse(tt.b)
		if got := netaddr.Conflicts(a, b); got != tt.want {
			t.Errorf("Conflicts(%s, %s) = %v; want %v", a, b, got, tt.want)
		}
		if got := netaddr.Conflicts(b, a); got != tt.want {
			t.Errorf("Conflicts(%s, %s) = %v; want %v", b, a, got, tt.want)
		}
	}
}

func TestIsWildcard(t *testing.T) {
	for s, want := range map[string]bool{"0.0.0.0": true, "::": true, "127.0.0.1": false, "::1": false} {
		if got := netaddr.IsWildcard(netaddr.MustParse(s)); got != want {
			t.Errorf("IsWildcard(%s) = %v; want %v", s, got, want)
		}
	}
	if netaddr.IsWildcard(netip.Addr{}) {
		t.Error("IsWildcard(zero) = true; want false")
	}
}

// FuzzAddr checks that anything Parse accepts packs and unpacks to itself,
// and that the conflict rule is symmetric and reflexive.
func FuzzAddr(f *testing.F) {
	f.Add("127.0.0.1", "0.0.0.0")
	f.Add("::", "::1")
	f.Add("::ffff:1.2.3.4", "1.2.3.4")
	f.Fuzz(func(t *testing.T, s1, s2 string) {
		a, err := netaddr.Parse(s1)
		if err != nil {
			return
		}
		p, err := netaddr.Pack(a)
		if err != nil {
			t.Fatalf("Pack(%v) error %v after Parse accepted it", a, err)
		}
		back, err := netaddr.Unpack(p)
		if err != nil || back != a {
			t.Fatalf("Unpack(Pack(%v)) = %v, %v; want %v", a, back, err, a)
		}
		if !netaddr.Conflicts(a, a) {
			t.Fatalf("Conflicts(%v, %v) = false; want true", a, a)
		}
		b, err := netaddr.Parse(s2)
		if err != nil {
			return
		}
		if netaddr.Conflicts(a, b) != netaddr.Conflicts(b, a) {
			t.Fatalf("Conflicts(%v, %v) != Conflicts(%v, %v)", a, b, b, a)
		}
	})
}
