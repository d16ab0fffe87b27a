package exclude_test

import (
	"slices"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/exclude"
)

func TestBrowser(t *testing.T) {
	ps := exclude.Browser()
	if !slices.IsSorted(ps) {
		t.Errorf("Browser() = %v; want them in ascending order", ps)
	}
	for _, p := range []uint16{1, 6000, 6665, 6669, 10080} {
		if !slices.Contains(ps, p) {
			t.Errorf("Browser() lacks %d", p)
		}
	}
	ps[0] = 0
	if exclude.Browser()[0] != 1 {
		t.Error("Browser returns the list itself; want a copy")
	}
}

func TestList(t *testing.T) {
	has := func(ex []exclude.Exclusion, source string) bool {
		return slices.ContainsFunc(ex, func(e exclude.Exclusion) bool { return e.Source == source })
	}
	const browsers = "web browsers' restricted ports"
	ex, _ := exclude.List(portalloc.Config{Exclude: []portalloc.Range{{First: 22000, Last: 22100}}})
	if !has(ex, browsers) || !has(ex, "Config.Exclude (BERTH_PORT_EXCLUDE)") || !has(ex, "the OS ephemeral range") {
		t.Errorf("List(default config with Exclude) = %+v; want Config.Exclude, the OS ephemeral range and the browsers' ports", ex)
	}
	ex, _ = exclude.List(portalloc.Config{AllowBrowserRestricted: true, AllowEphemeralOverlap: true})
	if has(ex, browsers) || has(ex, "the OS ephemeral range") {
		t.Errorf("List(both allowed) = %+v; want neither the browsers' ports nor the ephemeral range", ex)
	}
}
