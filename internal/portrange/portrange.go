// Package portrange walks port ranges in the order berth tries candidates,
// and reads the ranges the system keeps for itself.
//
// A range is split in two segments, as Kubernetes splits its NodePort
// range (KEP-3668): a static segment of StaticSegmentSize(size) ports at
// its low end, for ports asked for by number, and a dynamic segment above
// it, which allocation scans first, falling back to the static one only
// when the dynamic one is full. Each segment is visited from a random
// start with a random stride coprime with its size: one pass visits every
// port once, with no list, and allocators that start together do not walk
// in lockstep.
package portrange

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Range is the ports First through Last, both included: this package's
// own, as store.Range is the public one (an internal package imports no
// other package of berth).
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

// parse reads "FIRST-LAST" or "PORT" from a file of the system: not
// input of a user's, which package store parses.
func parse(s string) (Range, error) {
	first, last, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if !isRange {
		last = first
	}
	a, err1 := strconv.ParseUint(first, 10, 16)
	b, err2 := strconv.ParseUint(last, 10, 16)
	if err1 != nil || err2 != nil || a == 0 || a > b {
		return Range{}, fmt.Errorf("port range %q: want FIRST-LAST, ports 1 to 65535", s)
	}
	return Range{First: uint16(a), Last: uint16(b)}, nil
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
	s := &Set{r: r, size: r.Size()}
	for p := int(r.First); p < int(r.First)+s.size; p++ {
		s.allowed[p/64] |= 1 << (p % 64)
	}
	return s.Without(exclude...)
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
