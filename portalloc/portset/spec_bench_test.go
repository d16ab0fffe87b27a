package portset

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// chainSpec is the JSON of a set of n groups, each with a port and a
// reference to the previous group's port: the shape whose validation was
// quadratic when each reference searched the groups (40,000 groups took
// 9 s, 100,000 took 70 s).
func chainSpec(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"name":"big","groups":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"g%d","ports":[{"name":"http"}],"refs":[{"env":"UP","to":"g%d.http"}]}`, i, max(i-1, 0))
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// noLimits lifts every SetSpec limit, to measure how parsing and
// validation grow past them.
var noLimits = specLimits{math.MaxInt, math.MaxInt, math.MaxInt, math.MaxInt, math.MaxInt, math.MaxInt, math.MaxInt}

// BenchmarkParseSetSpec parses and validates chains of 1k, 10k and 100k
// groups. 100k groups (8 MB) is beyond maxSetGroups and maxSetSpecSize, so
// every size runs with the limits lifted (parseSetSpec with noLimits):
// the time per group should stay flat from one size to the next.
func BenchmarkParseSetSpec(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		data := chainSpec(n)
		b.Run(fmt.Sprintf("groups=%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseSetSpec(data, noLimits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/group")
		})
	}
}

// TestParseSetSpecUnlimited: the chain the benchmark measures parses with
// the limits lifted, and ParseSetSpec refuses it beyond them, naming the
// limit.
func TestParseSetSpecUnlimited(t *testing.T) {
	data := chainSpec(maxSetGroups + 1)
	if _, err := parseSetSpec(data, noLimits); err != nil {
		t.Fatalf("parseSetSpec(%d groups, no limits) = %v; want nil", maxSetGroups+1, err)
	}
	if _, err := ParseSetSpec(data); err == nil || !strings.Contains(err.Error(), "at most 10000 groups") {
		t.Errorf("ParseSetSpec(%d groups) = %v; want an error naming the limit of 10000 groups", maxSetGroups+1, err)
	}
	big := chainSpec(15000) // over 1 MiB
	if len(big) <= maxSetSpecSize {
		t.Fatalf("chainSpec(15000) has %d bytes; want more than %d", len(big), maxSetSpecSize)
	}
	if _, err := ParseSetSpec(big); err == nil || !strings.Contains(err.Error(), "(1 MiB)") {
		t.Errorf("ParseSetSpec(%d bytes) = %v; want an error naming the limit of 1 MiB", len(big), err)
	}
	if _, err := ParseSetSpec(chainSpec(maxSetGroups)); err != nil {
		t.Errorf("ParseSetSpec(%d groups) = %v; want nil: the limit itself is allowed", maxSetGroups, err)
	}
}
