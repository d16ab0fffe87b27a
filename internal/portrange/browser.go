package portrange

import "slices"

// browserRestricted are the ports web browsers refuse to connect to
// whatever serves them ("This address is restricted", ERR_UNSAFE_PORT):
// a dev server given one would be unreachable from the browser with no
// error on its side. They are the "bad ports" of the WHATWG Fetch
// standard (https://fetch.spec.whatwg.org/#port-blocking), which both
// browsers keep: Chromium's kRestrictedPorts in net/base/port_util.cc
// and Firefox's gBadPortList in netwerk/base/nsIOService.cpp, as of 2025.
// In ascending order.
var browserRestricted = []uint16{
	1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79,
	87, 95, 101, 102, 103, 104, 109, 110, 111, 113, 115, 117, 119, 123, 135, 137,
	139, 143, 161, 179, 389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532,
	540, 548, 554, 556, 563, 587, 601, 636, 989, 990, 993, 995, 1719, 1720, 1723,
	2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566, 6665, 6666, 6667, 6668, 6669,
	6679, 6697, 10080,
}

// BrowserRestrictedRanges returns the ports web browsers refuse to connect
// to, as one-port ranges.
func BrowserRestrictedRanges() []Range {
	out := make([]Range, len(browserRestricted))
	for i, p := range browserRestricted {
		out[i] = Range{First: p, Last: p}
	}
	return out
}

// IsBrowserRestricted reports whether web browsers refuse to connect to p.
func IsBrowserRestricted(p uint16) bool {
	_, found := slices.BinarySearch(browserRestricted, p)
	return found
}
