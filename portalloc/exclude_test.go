package portalloc_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/berth-go/berth/portalloc"
)

func TestBrowserRestrictedPorts(t *testing.T) {
	ps := portalloc.BrowserRestrictedPorts()
	if !slices.IsSorted(ps) {
		t.Errorf("BrowserRestrictedPorts() = %v; want them in ascending order", ps)
	}
	for _, p := range []uint16{1, 6000, 6665, 6669, 10080} {
		if !slices.Contains(ps, p) {
			t.Errorf("BrowserRestrictedPorts() lacks %d", p)
		}
	}
	ps[0] = 0
	if portalloc.BrowserRestrictedPorts()[0] != 1 {
		t.Error("BrowserRestrictedPorts returns the list itself; want a copy")
	}
}

// TestBrowserRestrictedSkipped: the ports browsers refuse (6665-6669 here)
// are never handed out from the range nor taken from Prefer by default;
// with Config.AllowBrowserRestricted they are; Reserve takes them either
// way.
func TestBrowserRestrictedSkipped(t *testing.T) {
	ctx := context.Background()
	rng := portalloc.Range{First: 6664, Last: 6670} // 6665-6669 restricted
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, Order: portalloc.OrderLowest, AllowEphemeralOverlap: true})
	var got []uint16
	for {
		r, err := a.Allocate(ctx, portalloc.Request{Prefer: []uint16{6666}})
		if errors.Is(err, portalloc.ErrRangeExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Port)
	}
	slices.Sort(got)
	if want := []uint16{6664, 6670}; !slices.Equal(got, want) {
		t.Errorf("Allocate in %v (Prefer 6666) until exhausted = %v; want %v, no restricted port", rng, got, want)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, 6667); err != nil {
		t.Errorf("Reserve(6667) = %v; want it taken: a port asked for by number is chosen", err)
	}

	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, Order: portalloc.OrderLowest, AllowBrowserRestricted: true, AllowEphemeralOverlap: true})
	r, err := b.Allocate(ctx, portalloc.Request{Prefer: []uint16{6666}})
	if err != nil || r.Port != 6666 {
		t.Errorf("with AllowBrowserRestricted, Allocate(Prefer 6666) = %v, %v; want 6666", r.Port, err)
	}
	got = nil
	for {
		r, err := b.Allocate(ctx, portalloc.Request{})
		if errors.Is(err, portalloc.ErrRangeExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Port)
	}
	if want := []uint16{6664, 6665, 6667, 6668, 6669, 6670}; !slices.Equal(got, want) {
		t.Errorf("with AllowBrowserRestricted, Allocate in %v (lowest first) until exhausted = %v; want %v", rng, got, want)
	}
}

func TestExclusions(t *testing.T) {
	has := func(ex []portalloc.Exclusion, source string) bool {
		return slices.ContainsFunc(ex, func(e portalloc.Exclusion) bool { return e.Source == source })
	}
	const browsers = "web browsers' restricted ports"
	ex, _ := portalloc.Exclusions(portalloc.Config{Exclude: []portalloc.Range{{First: 22000, Last: 22100}}})
	if !has(ex, browsers) || !has(ex, "Config.Exclude (BERTH_PORT_EXCLUDE)") || !has(ex, "the OS ephemeral range") {
		t.Errorf("Exclusions(default config with Exclude) = %+v; want Config.Exclude, the OS ephemeral range and the browsers' ports", ex)
	}
	ex, _ = portalloc.Exclusions(portalloc.Config{AllowBrowserRestricted: true, AllowEphemeralOverlap: true})
	if has(ex, browsers) || has(ex, "the OS ephemeral range") {
		t.Errorf("Exclusions(both allowed) = %+v; want neither the browsers' ports nor the ephemeral range", ex)
	}
}
