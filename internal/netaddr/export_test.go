package netaddr

import "net/netip"

// Parse parses s as an IP address and returns its normal form.
func Parse(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, &AddrError{Input: s, Reason: "not an IP address; use an IPv4 or IPv6 literal such as 127.0.0.1, ::1, 0.0.0.0 or ::"}
	}
	return Normalize(a)
}

// MustParse is like Parse but panics on error. It is meant for constants in
// programs and tests.
func MustParse(s string) netip.Addr {
	a, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return a
}

// IsWildcard reports whether a is 0.0.0.0 or ::.
func IsWildcard(a netip.Addr) bool {
	return a.IsValid() && a.IsUnspecified()
}
