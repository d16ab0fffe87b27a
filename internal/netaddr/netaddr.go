// Package netaddr parses, normalises and packs the IP addresses that berth
// stores, and decides when two reservations of the same protocol and port
// conflict.
//
// An address is stored in its normal form: an IPv4-mapped IPv6 address
// becomes the IPv4 address it maps, and an IPv6 zone (fe80::1%eth0) is
// refused: it names an interface of one host, which the wildcard rule
// cannot compare. Packed, IPv4 is 4 bytes and IPv6 16; the wildcards are
// all zeros. Conflicts decides the conflict rule of package store's doc.
package netaddr

import (
	"errors"
	"fmt"
	"net/netip"
)

// ErrInvalid is wrapped by every error this package returns for an address
// that cannot be used.
var ErrInvalid = errors.New("invalid address")

// AddrError reports an address that was rejected and why.
type AddrError struct {
	Input  string // the address as the caller gave it
	Reason string // what is wrong with it and what is accepted instead
}

func (e *AddrError) Error() string { return fmt.Sprintf("address %q: %s", e.Input, e.Reason) }

// Unwrap returns ErrInvalid, so that errors.Is(err, ErrInvalid) holds.
func (e *AddrError) Unwrap() error { return ErrInvalid }

// Normalize returns the normal form of a: IPv4-mapped IPv6 becomes IPv4.
// The zero Addr and zoned addresses are refused.
func Normalize(a netip.Addr) (netip.Addr, error) {
	if !a.IsValid() {
		return netip.Addr{}, &AddrError{Input: "", Reason: "no address given; use an IPv4 or IPv6 literal such as 127.0.0.1 or ::1"}
	}
	if a.Zone() != "" {
		return netip.Addr{}, &AddrError{Input: a.String(), Reason: "zoned IPv6 addresses are not supported; use an address without %zone"}
	}
	return a.Unmap(), nil
}

// Pack returns the packed form of the normal form of a: 4 bytes for IPv4, 16
// for IPv6. It returns an error when a cannot be normalised.
func Pack(a netip.Addr) ([]byte, error) {
	n, err := Normalize(a)
	if err != nil {
		return nil, err
	}
	return n.AsSlice(), nil
}

// Unpack is the inverse of Pack. It accepts exactly 4 or 16 bytes.
func Unpack(b []byte) (netip.Addr, error) {
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		return netip.Addr{}, &AddrError{Input: fmt.Sprintf("%x", b), Reason: fmt.Sprintf("packed address has %d bytes; want 4 (IPv4) or 16 (IPv6)", len(b))}
	}
	if a.Is4In6() {
		// Pack never writes this form; accepting it would give one address
		// two packed spellings and defeat the primary key.
		return netip.Addr{}, &AddrError{Input: fmt.Sprintf("%x", b), Reason: "packed address is IPv4-mapped IPv6; want the 4-byte IPv4 form"}
	}
	return a, nil
}

// Conflicts reports whether reservations of the same protocol and port on a
// and b conflict under the rule in the package documentation. Both addresses
// must be in normal form; Conflicts(a, b) == Conflicts(b, a).
func Conflicts(a, b netip.Addr) bool { return a == b || a.IsUnspecified() || b.IsUnspecified() }
