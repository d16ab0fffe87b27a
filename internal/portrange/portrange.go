// Package portrange parses port ranges and walks them in the order berth
// tries candidates.
//
// # Segments
//
// A range is split in two segments, as Kubernetes splits its NodePort
// range in two "bands" (KEP-3668; in berth a band is a fleet-wide range,
// see store.FleetRequest): a static segment of StaticSegmentSize(size)
// ports at its low end, for ports that callers ask for by number, and a
// dynamic segment above it, which allocation scans first. Only when the
// dynamic segment is full does allocation fall back to the static
// segment.
//
// # Candidate order
//
// Each segment is visited from a random start with a random stride
// coprime with the segment's size, so one pass visits every port exactly
// once without a list of candidates, and allocators that start together do
// not walk in lockstep.
package portrange

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every error of this package. It is the
// one sentinel of refused input of berth: package store names it
// store.ErrInvalid and package portalloc ErrInvalidRequest, so a range
// error is one of a refused request wherever it surfaces.
var ErrInvalid = errors.New("invalid request")

// Range is the ports First through Last, both included. It is declared
// here, the lowest package that reads ranges, and named store.Range,
// portalloc.Range and portalloc.Band above: one type, whichever name a
// caller uses. The zero Range is empty and not valid.
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

func (r Range) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// Validate returns nil for a non-empty range of ports 1-65535, FIRST <= LAST,
// and otherwise a *FieldError that says what is wrong.
func (r Range) Validate() error {
	if r.First == 0 {
		return refuse(r.String(), "", ports, "port 0 is not a port")
	}
	if r.First > r.Last {
		return refuse(fmt.Sprintf("%d-%d", r.First, r.Last), "", ordered, "the first port is above the last")
	}
	return nil
}

// Valid is Validate.
//
// Deprecated: use Validate, the name Go gives a check that returns an
// error; Valid stays for the programs that call it.
func (r Range) Valid() error { return r.Validate() }

// What a range accepts, for FieldError.Want.
const (
	syntax  = "FIRST-LAST (e.g. 20000-32767) or a single port, with ports 1 to 65535"
	ports   = "ports from 1 to 65535"
	ordered = "FIRST-LAST with FIRST <= LAST"
)

// Parse parses "FIRST-LAST" or a single port "PORT". It accepts decimal
// digits only: no spaces, signs or leading "+". The error is a
// *FieldError for the field "port range".
func Parse(s string) (Range, error) {
	if s == "" {
		return Range{}, refuse(s, "", syntax, "it is empty")
	}
	first, last, isRange := strings.Cut(s, "-")
	a, err := parsePort(s, first)
	if err != nil {
		return Range{}, err
	}
	b := a
	if isRange {
		if b, err = parsePort(s, last); err != nil {
			return Range{}, err
		}
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
		return 0, refuse(input, "", syntax, "a port is missing")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, refuse(input, "", syntax, Quote(s)+" is not a port number")
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > 65535 {
		return 0, refuse(input, "", ports, clip(s)+" is above 65535, the highest port")
	}
	if n == 0 {
		return 0, refuse(input, "", ports, "port 0 is not a port")
	}
	return uint16(n), nil
}

// ParseList parses a comma-separated list of ranges, e.g.
// "22000-22100,25565". The empty string is the empty list. The error is a
// *FieldError whose Value is the whole list and whose At names the item.
func ParseList(s string) ([]Range, error) {
	if s == "" {
		return nil, nil
	}
	var out []Range
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		n++
		r, err := Parse(part)
		if err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				fe.Value, fe.At = s, item(n, part)
			}
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// StaticSegmentSize returns the size of the static segment of a range of
// size ports: 0 for ranges of 16 ports or fewer, else size/32 clamped to
// 16-128.
func StaticSegmentSize(size int) int {
	if size <= 16 {
		return 0
	}
	return min(max(size/32, 16), 128)
}

// Set is a range with some of its ports taken out. Its zero value is empty.
// A Set is immutable once built and safe for concurrent use.
type Set struct {
	r       Range
	allowed [65536 / 64]uint64 // bit p set: port p may be handed out
	size    int
}

// NewSet returns the ports of r that are in none of the excluded ranges.
func NewSet(r Range, exclude ...Range) *Set {
	s := &Set{r: r}
	if r.Size() == 0 {
		return s
	}
	for p := int(r.First); p <= int(r.Last); p++ {
		s.allowed[p/64] |= 1 << (p % 64)
	}
	for _, x := range exclude {
		if x.Size() == 0 {
			continue
		}
		for p := max(int(x.First), int(r.First)); p <= min(int(x.Last), int(r.Last)); p++ {
			s.allowed[p/64] &^= 1 << (p % 64)
		}
	}
	for _, w := range s.allowed {
		s.size += popcount(w)
	}
	return s
}

func popcount(w uint64) int {
	n := 0
	for ; w != 0; w &= w - 1 {
		n++
	}
	return n
}

// Without returns a copy of s with the ports of the given ranges taken out.
// The copy keeps s's range, and so its segments.
func (s *Set) Without(exclude ...Range) *Set {
	out := *s
	for _, x := range exclude {
		if x.Size() == 0 {
			continue
		}
		for p := max(int(x.First), int(s.r.First)); p <= min(int(x.Last), int(s.r.Last)); p++ {
			if out.allowed[p/64]&(1<<(p%64)) != 0 {
				out.allowed[p/64] &^= 1 << (p % 64)
				out.size--
			}
		}
	}
	return &out
}

// Range returns the range the set was built from.
func (s *Set) Range() Range { return s.r }

// Len returns the number of ports in the set.
func (s *Set) Len() int { return s.size }

// Contains reports whether p is in the set.
func (s *Set) Contains(p uint16) bool { return s.allowed[p/64]&(1<<(p%64)) != 0 }

// Segments returns the static (low) and dynamic (high) segments of the
// set's range. The static segment is empty for ranges of 16 ports or fewer.
func (s *Set) Segments() (static, dynamic Range) {
	n := StaticSegmentSize(s.r.Size())
	if n == 0 {
		return Range{}, s.r
	}
	split := s.r.First + uint16(n)
	return Range{First: s.r.First, Last: split - 1}, Range{First: split, Last: s.r.Last}
}

// Candidates returns an iterator over every port of the set, each once: the
// dynamic segment, then the static segment, each from a random start by a
// random stride coprime with its size. rng supplies the randomness (seed it for
// reproducible tests); it is used only during this call.
func (s *Set) Candidates(rng *rand.Rand) *Iter {
	static, dynamic := s.Segments()
	it := &Iter{set: s}
	it.segments[0] = newWalk(dynamic, rng)
	it.segments[1] = newWalk(static, rng)
	return it
}

// Lowest returns an iterator over every port of the set, each once, from
// the lowest up, segments ignored.
func (s *Set) Lowest() *Iter {
	it := &Iter{set: s}
	if n := s.r.Size(); n > 0 {
		it.segments[0] = walk{first: int(s.r.First), size: n, stride: 1, left: n}
	}
	return it
}

// Iter yields candidate ports. It is not safe for concurrent use.
type Iter struct {
	set      *Set
	segments [2]walk
	segment  int
}

// Next returns the next candidate port, or false when every port of the
// set has been returned once.
func (it *Iter) Next() (uint16, bool) {
	for it.segment < len(it.segments) {
		w := &it.segments[it.segment]
		for w.left > 0 {
			p := w.next()
			if it.set.Contains(p) {
				return p, true
			}
		}
		it.segment++
	}
	return 0, false
}

// walk visits every port of a segment once: start, start+stride, ... modulo
// the size. A stride coprime with the size makes that a permutation.
type walk struct {
	first       int
	size        int
	pos, stride int
	left        int
}

func newWalk(r Range, rng *rand.Rand) walk {
	n := r.Size()
	if n == 0 {
		return walk{}
	}
	stride := 1
	if n > 2 {
		for stride = 1 + rng.IntN(n-1); gcd(stride, n) != 1; stride = 1 + rng.IntN(n-1) {
		}
	}
	return walk{first: int(r.First), size: n, pos: rng.IntN(n), stride: stride, left: n}
}

func (w *walk) next() uint16 {
	p := w.first + w.pos
	w.pos = (w.pos + w.stride) % w.size
	w.left--
	return uint16(p)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
