package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/exclude"
)

// printExclusions adds to berth doctor's report what berth leaves out of
// the range besides the OS ephemeral range (reported on its own line), and
// why: each source with its ports in the range, runs merged.
func printExclusions(line func(k, format string, a ...any), cfg portalloc.Config) {
	ex, err := exclude.List(cfg)
	if err != nil {
		line("excluded", "%v", err)
	}
	for _, e := range ex {
		if strings.Contains(e.Source, "ephemeral") {
			continue
		}
		in, n := clip(e.Ports, cfg.Range)
		where := "none in the range"
		if n > 0 {
			shown := make([]string, 0, 10)
			for _, r := range in[:min(len(in), 10)] {
				shown = append(shown, r.String())
			}
			more := ""
			if len(in) > len(shown) {
				more = fmt.Sprintf(" and %d more", len(in)-len(shown))
			}
			where = fmt.Sprintf("%d ports of the range: %s%s", n, strings.Join(shown, ","), more)
		}
		line("excluded", "%s: %s (%s)", e.Source, where, e.Why)
	}
}

// clip returns the parts of rs inside within, sorted, adjacent and
// overlapping ones merged, and how many ports they hold.
func clip(rs []portalloc.Range, within portalloc.Range) ([]portalloc.Range, int) {
	var out []portalloc.Range
	for _, r := range rs {
		if first, last := max(r.First, within.First), min(r.Last, within.Last); first <= last {
			out = append(out, portalloc.Range{First: first, Last: last})
		}
	}
	slices.SortFunc(out, func(a, b portalloc.Range) int { return cmp.Compare(a.First, b.First) })
	merged := out[:0]
	n := 0
	for _, r := range out {
		if k := len(merged) - 1; k >= 0 && int(r.First) <= int(merged[k].Last)+1 {
			merged[k].Last = max(merged[k].Last, r.Last)
			continue
		}
		merged = append(merged, r)
	}
	for _, r := range merged {
		n += int(r.Last-r.First) + 1
	}
	return merged, n
}
