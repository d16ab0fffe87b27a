package portrange

import (
	"math/rand/v2"
	"testing"
)

func TestStaticSegmentSize(t *testing.T) {
	for size, want := range map[int]int{10: 0, 16: 0, 17: 16, 128: 16, 511: 16, 2048: 64, 2768: 86, 4096: 128, 12768: 128} {
		if got := StaticSegmentSize(size); got != want {
			t.Errorf("StaticSegmentSize(%d) = %d; want %d", size, got, want)
		}
	}
}

func TestBands(t *testing.T) {
	s := NewSet(Range{20000, 32767})
	static, dynamic := s.Segments()
	if static != (Range{20000, 20127}) || dynamic != (Range{20128, 32767}) {
		t.Errorf("Segments(20000-32767) = %v, %v; want 20000-20127, 20128-32767", static, dynamic)
	}
	static, dynamic = NewSet(Range{100, 110}).Segments()
	if static.Size() != 0 || dynamic != (Range{100, 110}) {
		t.Errorf("Segments(100-110) = %v, %v; want no static segment", static, dynamic)
	}
}

// TestCandidatesVisitEveryPortOnce is the property the scan relies on: for
// any range and seed, one pass yields every allowed port exactly once, the
// whole dynamic segment before any port of the static segment.
func TestCandidatesVisitEveryPortOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 2, 3, 4, 15, 16, 17, 31, 32, 33, 64, 97, 100, 128, 255, 256, 511, 1000, 2048, 2768, 4096, 12768}
	for range 40 {
		sizes = append(sizes, 1+rng.IntN(5000))
	}
	for _, size := range sizes {
		first := 1 + rng.IntN(65536-size)
		r := Range{uint16(first), uint16(first + size - 1)}
		var exclude []Range
		if size > 10 && rng.IntN(2) == 0 {
			a := first + rng.IntN(size)
			exclude = append(exclude, Range{uint16(a), uint16(min(a+rng.IntN(10), 65535))})
		}
		s := NewSet(r, exclude...)
		static, _ := s.Segments()
		for seed := range 5 {
			it := s.Candidates(rand.New(rand.NewPCG(uint64(seed), uint64(size))))
			seen := map[uint16]bool{}
			inStatic := false
			for {
				p, ok := it.Next()
				if !ok {
					break
				}
				if seen[p] {
					t.Fatalf("range %v seed %d: port %d visited twice", r, seed, p)
				}
				if !s.Contains(p) {
					t.Fatalf("range %v exclude %v seed %d: port %d not in the set", r, exclude, seed, p)
				}
				seen[p] = true
				if static.Contains(p) {
					inStatic = true
				} else if inStatic {
					t.Fatalf("range %v seed %d: dynamic port %d after the static segment began", r, seed, p)
				}
			}
			if len(seen) != s.Len() {
				t.Fatalf("range %v exclude %v seed %d: visited %d ports; want %d", r, exclude, seed, len(seen), s.Len())
			}
		}
	}
}

// TestCandidatesDiffer checks that two allocators do not walk in lockstep.
func TestCandidatesDiffer(t *testing.T) {
	s := NewSet(Range{20000, 32767})
	a := s.Candidates(rand.New(rand.NewPCG(1, 1)))
	b := s.Candidates(rand.New(rand.NewPCG(2, 2)))
	same := 0
	for range 100 {
		pa, _ := a.Next()
		pb, _ := b.Next()
		if pa == pb {
			same++
		}
	}
	if same > 5 {
		t.Errorf("two seeds agreed on %d of the first 100 candidates", same)
	}
}

func TestSetExclusions(t *testing.T) {
	s := NewSet(Range{100, 200}, Range{150, 160}, Range{1, 100}, Range{199, 300})
	if got, want := s.Len(), 101-11-1-2; got != want {
		t.Errorf("Len = %d; want %d", got, want)
	}
	for p, want := range map[uint16]bool{100: false, 101: true, 149: true, 150: false, 160: false, 161: true, 198: true, 199: false, 201: false} {
		if got := s.Contains(p); got != want {
			t.Errorf("Contains(%d) = %v; want %v", p, got, want)
		}
	}
	if NewSet(Range{5, 5}, Range{5, 5}).Len() != 0 {
		t.Error("a fully excluded range is not empty")
	}
}

func TestParseOSOutput(t *testing.T) {
	if r, err := parseLinux("32768\t60999\n"); err != nil || r != (Range{32768, 60999}) {
		t.Errorf("parseLinux = %v, %v", r, err)
	}
	if _, err := parseLinux("garbage"); err == nil {
		t.Error("parseLinux(garbage) = nil error")
	}
	dyn := "\nProtocol tcp Dynamic Port Range\n---------------------------------\nStart Port      : 49152\nNumber of Ports : 16384\n"
	if r, err := parseNetshDynamic(dyn); err != nil || r != (Range{49152, 65535}) {
		t.Errorf("parseNetshDynamic = %v, %v", r, err)
	}
	if _, err := parseNetshDynamic("Start Port : 60000\nNumber of Ports : 10000\n"); err == nil {
		t.Error("parseNetshDynamic past 65535 = nil error")
	}
	excl := "\nProtocol tcp Port Exclusion Ranges\n\nStart Port    End Port\n----------    --------\n      5357        5357\n     50000       50059     *\n\n* - Administered port exclusions.\n"
	got := parseNetshExcluded(excl)
	if len(got) != 2 || got[0] != (Range{5357, 5357}) || got[1] != (Range{50000, 50059}) {
		t.Errorf("parseNetshExcluded = %v", got)
	}
}

func TestEphemeral(t *testing.T) {
	r, err := Ephemeral()
	if err != nil {
		t.Logf("Ephemeral: %v (using %v)", err, r)
	}
	if r.Size() == 0 {
		t.Errorf("Ephemeral() = %v; want a valid range", r)
	}
}

// TestLowestAscends: Lowest visits every port of the set once, in
// increasing order, exclusions skipped.
func TestLowestAscends(t *testing.T) {
	for _, tc := range []struct {
		r       Range
		exclude []Range
	}{
		{Range{5, 5}, nil},
		{Range{3000, 3099}, nil},
		{Range{3000, 3099}, []Range{{3000, 3001}, {3050, 3060}}},
		{Range{65530, 65535}, nil},
		{Range{1, 65535}, []Range{{2, 65534}}},
	} {
		s := NewSet(tc.r, tc.exclude...)
		it := s.Lowest()
		var got []uint16
		for p, ok := it.Next(); ok; p, ok = it.Next() {
			if n := len(got); n > 0 && p <= got[n-1] {
				t.Fatalf("range %v: %d after %d", tc.r, p, got[n-1])
			}
			if !s.Contains(p) {
				t.Fatalf("range %v exclude %v: %d is not in the set", tc.r, tc.exclude, p)
			}
			got = append(got, p)
		}
		if len(got) != s.Len() {
			t.Errorf("range %v exclude %v: %d ports; want %d", tc.r, tc.exclude, len(got), s.Len())
		}
	}
}
