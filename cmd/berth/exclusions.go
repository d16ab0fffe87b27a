package main

import (
	"fmt"
	"strings"

	"github.com/berth-go/berth/portalloc"
)

// printExclusions adds to berth doctor's report what berth leaves out of
// the range besides the OS ephemeral range (reported on its own line), and
// why: each source with its ports in the range.
func printExclusions(line func(k, format string, a ...any), cfg portalloc.Config) {
	ex, err := portalloc.Exclusions(cfg)
	if err != nil {
		line("excluded", "%v", err)
	}
	for _, e := range ex {
		if strings.Contains(e.Source, "ephemeral") {
			continue
		}
		var in []string
		n := 0
		for _, r := range e.Ports {
			first, last := max(r.First, cfg.Range.First), min(r.Last, cfg.Range.Last)
			if first > last {
				continue
			}
			n += int(last-first) + 1
			if len(in) < 8 {
				in = append(in, portalloc.Range{First: first, Last: last}.String())
			} else if len(in) == 8 {
				in = append(in, "...")
			}
		}
		where := fmt.Sprintf("%d ports of the range: %s", n, strings.Join(in, ","))
		if n == 0 {
			where = "none in the range"
		}
		line("excluded", "%s: %s (%s)", e.Source, where, e.Why)
	}
}
