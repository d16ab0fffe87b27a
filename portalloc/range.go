package portalloc

import (
	"errors"
	"fmt"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/store"
)

// Range is the ports First through Last, both included: store.Range, the
// one port-range type of berth, under the name portalloc has always given
// it (see store.Range for its methods: Size, Contains, Overlaps, String
// and Valid, whose error is a *RangeError). The zero Range is empty and
// not valid; where Config or a pool's spec takes one, zero means their default.
// Range is a small value: copy it freely.
type Range = store.Range

// DefaultRange is 20000-32767: below the Linux ephemeral range (32768-60999)
// and the Windows and macOS dynamic range (49152-65535), so the OS never
// hands one of its ports to an outgoing connection.
var DefaultRange = Range{First: 20000, Last: 32767}

// RangeError reports a port range, or a list of them, that is not
// accepted: store.RangeError. Field names where the text came from: a
// variable such as BERTH_PORT_RANGE, a field such as Config.Range, or ""
// for the argument of ParseRange, ParseRanges or Range.Valid. Input is the
// text as given, Reason what is wrong and what is accepted.
// errors.Is(err, ErrInvalidRequest) holds for it.
type RangeError = store.RangeError

// rangeErr puts an error of package portrange into a *RangeError for
// field; nil stays nil.
func rangeErr(field string, err error) error {
	var pe *portrange.ParseError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pe):
		named := *pe
		named.Field = field
		return &named
	default:
		return fmt.Errorf("%w: %s: %w", ErrInvalidRequest, field, err)
	}
}

// ParseRange parses "FIRST-LAST" (e.g. "20000-32767") or a single port
// ("25565"). Ports run from 1 to 65535, FIRST <= LAST; no spaces or signs.
// The error is a *RangeError.
func ParseRange(s string) (Range, error) {
	r, err := portrange.Parse(s)
	if err != nil {
		return Range{}, rangeErr("", err)
	}
	return Range(r), nil
}

// ParseRanges parses a comma-separated list of ranges, such as
// "22000-22100,25565". The empty string is the empty list. The error is
// a *RangeError whose Input is the whole list and whose Reason names the
// item.
func ParseRanges(s string) ([]Range, error) {
	rs, err := portrange.ParseList(s)
	if err != nil {
		return nil, rangeErr("", err)
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
