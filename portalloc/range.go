package portalloc

import (
	"fmt"

	"github.com/berth-go/berth/internal/portrange"
)

// Range is the ports First through Last, both included. The zero Range is
// empty and not valid; where Config or PoolSpec take one, zero means their
// default. Range is a small value: copy it freely.
type Range struct {
	First, Last uint16
}

// DefaultRange is 20000-32767: below the Linux ephemeral range (32768-60999)
// and the Windows and macOS dynamic range (49152-65535), so the OS never
// hands one of its ports to an outgoing connection.
var DefaultRange = Range{First: 20000, Last: 32767}

// Size returns the number of ports in r; 0 for an invalid range.
func (r Range) Size() int { return portrange.Range(r).Size() }

// Contains reports whether p is in r.
func (r Range) Contains(p uint16) bool { return portrange.Range(r).Contains(p) }

// Overlaps reports whether r and o share a port.
func (r Range) Overlaps(o Range) bool { return portrange.Range(r).Overlaps(portrange.Range(o)) }

// String returns r as ParseRange reads it: "FIRST-LAST", or "PORT" for a
// range of one port.
func (r Range) String() string { return portrange.Range(r).String() }

// Valid returns nil for a non-empty range of ports 1-65535, FIRST <= LAST,
// and otherwise an error that says what is wrong, wrapping
// ErrInvalidRequest.
func (r Range) Valid() error {
	if err := portrange.Range(r).Valid(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

// ParseRange parses "FIRST-LAST" (e.g. "20000-32767") or a single port
// ("25565"). Ports run from 1 to 65535, FIRST <= LAST; no spaces or signs.
// Errors wrap ErrInvalidRequest.
func ParseRange(s string) (Range, error) {
	r, err := portrange.Parse(s)
	if err != nil {
		return Range{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return Range(r), nil
}

// ParseRanges parses a comma-separated list of ranges, such as
// "22000-22100,25565". The empty string is the empty list. Errors wrap
// ErrInvalidRequest.
func ParseRanges(s string) ([]Range, error) {
	rs, err := portrange.ParseList(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return ranges(rs), nil
}

// EphemeralRange returns the range the OS picks outgoing connections' local
// ports from (read once per process), and an error if it had to assume the
// IANA range 49152-65535.
func EphemeralRange() (Range, error) {
	r, err := portrange.Ephemeral()
	return Range(r), err
}

func ranges(rs []portrange.Range) []Range {
	if rs == nil {
		return nil
	}
	out := make([]Range, len(rs))
	for i, r := range rs {
		out[i] = Range(r)
	}
	return out
}

// internalRanges converts rs for the portrange package.
func internalRanges(rs []Range) []portrange.Range {
	out := make([]portrange.Range, len(rs))
	for i, r := range rs {
		out[i] = portrange.Range(r)
	}
	return out
}
