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
// and Validate, whose error is a *FieldError). The zero Range is empty and
// not valid; where Config or a pool's spec takes one, zero means their default.
// Range is a small value: copy it freely.
type Range = store.Range

// rangeErr names field in a *FieldError of package portrange (a range
// refused by a parse or by Valid); nil stays nil.
func rangeErr(field string, err error) error {
	var fe *FieldError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		named := *fe
		named.Field = field
		return &named
	default:
		return fmt.Errorf("%s: %w", field, err)
	}
}

// ParseRange parses "FIRST-LAST" (e.g. "20000-32767") or a single port
// ("25565"). Ports run from 1 to 65535, FIRST <= LAST; no spaces or signs.
// The error is "portalloc: " and a *FieldError for the field "port range"
// (errors.As), which wraps ErrInvalidRequest.
func ParseRange(s string) (Range, error) {
	r, err := portrange.Parse(s)
	if err != nil {
		return Range{}, opError("", err)
	}
	return Range(r), nil
}

// ParseRanges parses a comma-separated list of ranges, such as
// "22000-22100,25565". The empty string is the empty list. The error is
// "portalloc: " and a *FieldError for the field "port range" whose Value
// is the whole list and whose At names the item.
func ParseRanges(s string) ([]Range, error) {
	rs, err := portrange.ParseList(s)
	if err != nil {
		return nil, opError("", err)
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
