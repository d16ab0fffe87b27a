package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// exclusion is a set of ports berth does not hand out from its range, and
// why, as berth doctor shows them.
type exclusion struct {
	ports  []store.Range
	source string // where they come from
	why    string // why berth leaves them out, and how to keep them
}

// exclusions returns what an Allocator of cfg leaves out of cfg.Range,
// each with its reason; a system list that cannot be read is left out,
// and said so in the errors.
func exclusions(cfg portalloc.Config) ([]exclusion, []error) {
	var (
		out  []exclusion
		errs []error
	)
	ranges := func(rs []portrange.Range) []store.Range {
		out := make([]store.Range, len(rs))
		for i, r := range rs {
			out[i] = store.Range(r)
		}
		return out
	}
	if len(cfg.Exclude) > 0 {
		out = append(out, exclusion{cfg.Exclude, "Config.Exclude (BERTH_PORT_EXCLUDE)", "configured"})
	}
	if byOS, err := portrange.ReservedByOS(); err != nil {
		errs = append(errs, err)
	} else if len(byOS) > 0 {
		out = append(out, exclusion{ranges(byOS), "the OS's excluded port ranges", "the OS refuses to bind them (Hyper-V, WinNAT)"})
	}
	local, err := portrange.LocalReserved()
	if err != nil {
		errs = append(errs, err)
	}
	if len(local) > 0 {
		out = append(out, exclusion{ranges(local), "net.ipv4.ip_local_reserved_ports",
			"the administrator keeps them for other software; reserve and --prefer refuse them unless --allow-reserved"})
	}
	if !cfg.AllowBrowserRestricted {
		out = append(out, exclusion{ranges(portrange.BrowserRestrictedRanges()), "web browsers' restricted ports",
			"Chromium and Firefox refuse to connect to them; skipped in --prefer lists too; --allow-browser-restricted keeps them"})
	}
	return out, errs
}

// printExclusions adds to berth doctor's report what berth leaves out of
// the range besides the OS ephemeral range (reported on its own line), and
// why: each source with its ports in the range, runs merged.
func printExclusions(line func(k, format string, a ...any), cfg portalloc.Config) {
	ex, errs := exclusions(cfg)
	for _, err := range errs {
		line("excluded", "%v", err)
	}
	for _, e := range ex {
		in, n := clip(e.ports, cfg.Range)
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
		line("excluded", "%s: %s (%s)", e.source, where, e.why)
	}
}

// clip returns the parts of rs inside within, sorted, adjacent and
// overlapping ones merged, and how many ports they hold.
func clip(rs []store.Range, within store.Range) ([]store.Range, int) {
	var out []store.Range
	for _, r := range rs {
		if first, last := max(r.First, within.First), min(r.Last, within.Last); first <= last {
			out = append(out, store.Range{First: first, Last: last})
		}
	}
	slices.SortFunc(out, func(a, b store.Range) int { return cmp.Compare(a.First, b.First) })
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
