// Package exclude lists the ports an Allocator leaves out of its range,
// and why, as berth doctor shows them.
package exclude

import (
	"errors"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc"
)

// Browser returns the ports web browsers refuse to connect to whatever
// serves them ("This address is restricted", ERR_UNSAFE_PORT): the "bad
// ports" of the WHATWG Fetch standard, which Chromium and Firefox keep, in
// ascending order. Allocate never hands one out from the range and skips
// one in Request.Prefer, unless Config.AllowBrowserRestricted is set;
// Reserve takes them, since a caller that names a port has chosen it. The
// slice is the caller's own.
func Browser() []uint16 { return portrange.BrowserRestricted() }

// Exclusion is a set of ports an Allocator does not hand out from its
// range, and why, as List lists them for berth doctor. The zero value
// excludes nothing.
type Exclusion struct {
	// Ports are the ranges left out.
	Ports []portalloc.Range
	// Source says where they come from, such as "Config.Exclude" or
	// "net.ipv4.ip_local_reserved_ports".
	Source string
	// Why says why berth leaves them out, and how to keep them.
	Why string
}

// List returns what an Allocator made with cfg leaves out of cfg.Range,
// each with its reason: Config.Exclude, the OS ephemeral range (unless
// Config.AllowEphemeralOverlap), the ranges the OS keeps for itself
// (Windows' excluded port ranges), net.ipv4.ip_local_reserved_ports
// (Linux) and the ports browsers refuse (unless
// Config.AllowBrowserRestricted). It reads the OS's lists now; one that
// cannot be read is left out and its error returned, in a
// *portalloc.OpError, with the rest.
func List(cfg portalloc.Config) ([]Exclusion, error) {
	var (
		out  []Exclusion
		errs []error
	)
	if len(cfg.Exclude) > 0 {
		out = append(out, Exclusion{Ports: cfg.Exclude, Source: "Config.Exclude (" + portalloc.EnvPortExclude + ")", Why: "configured"})
	}
	if !cfg.AllowEphemeralOverlap {
		eph, err := portrange.Ephemeral()
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, Exclusion{Ports: []portalloc.Range{portalloc.Range(eph)}, Source: "the OS ephemeral range",
			Why: "the OS picks outgoing connections' local ports from it; " + portalloc.EnvAllowEphemeralOverlap + "=true keeps it"})
	}
	if byOS, err := portrange.ReservedByOS(); err != nil {
		errs = append(errs, err)
	} else if len(byOS) > 0 {
		out = append(out, Exclusion{Ports: ranges(byOS), Source: "the OS's excluded port ranges", Why: "the OS refuses to bind them (Hyper-V, WinNAT)"})
	}
	local, err := portrange.LocalReserved()
	if err != nil {
		errs = append(errs, err)
	}
	if len(local) > 0 {
		out = append(out, Exclusion{Ports: ranges(local), Source: "net.ipv4.ip_local_reserved_ports",
			Why: "the administrator keeps them for other software; Reserve and Prefer refuse them unless Request.AllowOSReserved (--allow-reserved)"})
	}
	if !cfg.AllowBrowserRestricted {
		out = append(out, Exclusion{Ports: ranges(portrange.BrowserRestrictedRanges()), Source: "web browsers' restricted ports",
			Why: "Chromium and Firefox refuse to connect to them; skipped in Prefer lists too; " + portalloc.EnvAllowBrowserRestricted + "=true keeps them"})
	}
	if len(errs) > 0 {
		return out, &portalloc.OpError{Op: "exclusions", Err: errors.Join(errs...)}
	}
	return out, nil
}

// ranges converts the internal ranges to portalloc's.
func ranges(rs []portrange.Range) []portalloc.Range {
	out := make([]portalloc.Range, len(rs))
	for i, r := range rs {
		out[i] = portalloc.Range(r)
	}
	return out
}
