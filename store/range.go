package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Range is the ports First through Last, both included: the one port-range
// type of berth (a Config's range and exclusions, a fleet's band). The zero
// Range is empty and not valid.
type Range struct {
	First, Last uint16
}

// Size returns the number of ports in r; 0 for an invalid range.
func (r Range) Size() int {
	if r.First == 0 || r.First > r.Last {
		return 0
	}
	return int(r.Last) - int(r.First) + 1
}

// Contains reports whether p is in r.
func (r Range) Contains(p uint16) bool { return p != 0 && r.First <= p && p <= r.Last }

// Overlaps reports whether r and o share a port.
func (r Range) Overlaps(o Range) bool { return r.First <= o.Last && o.First <= r.Last }

// String returns "FIRST-LAST", or "PORT" for a range of one port.
func (r Range) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// Validate returns nil for a non-empty range of ports 1-65535 with
// FIRST <= LAST, and otherwise a *FieldError for "port range" that says
// what is wrong.
func (r Range) Validate() error {
	if r.First == 0 {
		return refuseRange(r.String(), rangePorts, "port 0 is not a port")
	}
	if r.First > r.Last {
		return refuseRange(fmt.Sprintf("%d-%d", r.First, r.Last), rangeOrdered, "the first port is above the last")
	}
	return nil
}

const ( // for FieldError.Want
	rangeSyntax  = "FIRST-LAST (e.g. 20000-32767) or a single port, with ports 1 to 65535"
	rangePorts   = "ports from 1 to 65535"
	rangeOrdered = "FIRST-LAST with FIRST <= LAST"
)

// ParseRange parses "FIRST-LAST" or a single port "PORT", in decimal digits
// only (no spaces or signs). The error is a *FieldError for the field
// "port range": a caller that read s from a flag or a variable names that
// in a copy.
func ParseRange(s string) (Range, error) {
	if s == "" {
		return Range{}, refuseRange(s, rangeSyntax, "it is empty")
	}
	first, last, isRange := strings.Cut(s, "-")
	if !isRange {
		last = first
	}
	a, err := parsePort(s, first)
	if err != nil {
		return Range{}, err
	}
	b, err := parsePort(s, last)
	if err != nil {
		return Range{}, err
	}
	r := Range{First: a, Last: b}
	if err := r.Validate(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			fe.Value = s
		}
		return Range{}, err
	}
	return r, nil
}

func parsePort(input, s string) (uint16, error) {
	if s == "" {
		return 0, refuseRange(input, rangeSyntax, "a port is missing")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, refuseRange(input, rangeSyntax, quote(s)+" is not a port number")
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > 65535 {
		if len(s) > 64 {
			s = s[:64] + "..."
		}
		return 0, refuseRange(input, rangePorts, s+" is above 65535, the highest port")
	}
	if n == 0 {
		return 0, refuseRange(input, rangePorts, "port 0 is not a port")
	}
	return uint16(n), nil
}

// ParseRanges parses a comma-separated list of ranges, e.g.
// "22000-22100,25565"; the empty string is the empty list. The error is a
// *FieldError whose Value is the whole list and whose At names the item.
func ParseRanges(s string) ([]Range, error) {
	if s == "" {
		return nil, nil
	}
	var out []Range
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		n++
		r, err := ParseRange(part)
		if err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				fe.Value, fe.At = s, fmt.Sprintf("item %d %s", n, quote(part))
			}
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func refuseRange(s, want, why string) *FieldError {
	return &FieldError{Field: "port range", Value: s, Want: want + "; " + why}
}
