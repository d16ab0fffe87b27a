package portalloc

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/berth-go/berth/internal/portrange"
)

// browserRestricted are the ports web browsers refuse to connect to
// whatever serves them ("This address is restricted", ERR_UNSAFE_PORT):
// a dev server given one would be unreachable from the browser with no
// error on its side. They are the "bad ports" of the WHATWG Fetch
// standard (https://fetch.spec.whatwg.org/#port-blocking), which both
// browsers keep: Chromium's kRestrictedPorts in net/base/port_util.cc
// and Firefox's gBadPortList in netwerk/base/nsIOService.cpp, as of 2025.
var browserRestricted = []uint16{
	1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79,
	87, 95, 101, 102, 103, 104, 109, 110, 111, 113, 115, 117, 119, 123, 135, 137,
	139, 143, 161, 179, 389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532,
	540, 548, 554, 556, 563, 587, 601, 636, 989, 990, 993, 995, 1719, 1720, 1723,
	2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566, 6665, 6666, 6667, 6668, 6669,
	6679, 6697, 10080,
}

// BrowserRestrictedPorts returns the ports web browsers refuse to connect
// to (Chromium's and Firefox's lists, the "bad ports" of the Fetch
// standard), in ascending order. Allocate never hands one out from the
// range and skips one in Request.Prefer, unless
// Config.AllowBrowserRestricted is set; Reserve takes them, since a caller
// that names a port has chosen it.
func BrowserRestrictedPorts() []uint16 { return slices.Clone(browserRestricted) }

// excluded is what an Allocator leaves out besides Config.Exclude and the
// OS ephemeral range, read once by New.
type excluded struct {
	// local are the ranges of net.ipv4.ip_local_reserved_ports.
	local []portrange.Range
	// browser: the browsers' restricted ports are left out.
	browser bool
}

// readExcluded reads what cfg leaves out; a list that cannot be read is
// logged and counts as empty.
func readExcluded(cfg Config) excluded {
	local, err := portrange.LocalReserved()
	if err != nil {
		cfg.Logger.Info("could not read the ports the administrator reserves; not leaving them out", "file", portrange.LocalReservedFile, "error", err.Error())
	}
	return excluded{local: local, browser: !cfg.AllowBrowserRestricted}
}

// ranges returns the ranges e leaves out of the range.
func (e excluded) ranges() []portrange.Range {
	out := slices.Clone(e.local)
	if e.browser {
		for _, p := range browserRestricted {
			out = append(out, portrange.Range{First: p, Last: p})
		}
	}
	return out
}

func (e excluded) localHas(p uint16) bool {
	return slices.ContainsFunc(e.local, func(r portrange.Range) bool { return r.Contains(p) })
}

func (e excluded) browserHas(p uint16) bool {
	_, found := slices.BinarySearch(browserRestricted, p)
	return e.browser && found
}

// localList shows the ranges of ip_local_reserved_ports as the sysctl does.
func (e excluded) localList() string {
	s := make([]string, len(e.local))
	for i, r := range e.local {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

// refuseLocal refuses port, named field, when the administrator reserves
// it, unless allow: a port of ip_local_reserved_ports is kept for other
// software, which may bind it at any time.
func (e excluded) refuseLocal(field string, port uint16, allow bool) error {
	if allow || !e.localHas(port) {
		return nil
	}
	return &FieldError{Field: field, Value: fmt.Sprint(port),
		Want: fmt.Sprintf("a port outside net.ipv4.ip_local_reserved_ports (%s), which the administrator keeps for other software; set Request.AllowOSReserved (berth --allow-reserved) to take it anyway", e.localList())}
}

// checkPrefer refuses a request that prefers a port the administrator
// reserves, unless it allows them.
func (a *Allocator) checkPrefer(req Request) error {
	for i, p := range req.Prefer {
		if err := a.excl.refuseLocal(fmt.Sprintf("Request.Prefer[%d]", i), p, req.AllowOSReserved); err != nil {
			return err
		}
	}
	return nil
}

// skipPreferred reports whether Allocate skips the preferred port p: a
// port browsers refuse, unless Config.AllowBrowserRestricted.
func (a *Allocator) skipPreferred(p uint16) bool {
	if !a.excl.browserHas(p) {
		return false
	}
	a.log.Info("skipping a preferred port that web browsers refuse to connect to (set Config.AllowBrowserRestricted or BERTH_ALLOW_BROWSER_RESTRICTED=true to allow it)", "port", p)
	return true
}

// Exclusion is a set of ports an Allocator does not hand out from its
// range, and why, as Exclusions lists them for berth doctor.
type Exclusion struct {
	// Ports are the ranges left out.
	Ports []Range
	// Source says where they come from, such as "Config.Exclude" or
	// "net.ipv4.ip_local_reserved_ports".
	Source string
	// Why says why berth leaves them out, and how to keep them.
	Why string
}

// Exclusions returns what an Allocator made with cfg leaves out of
// cfg.Range, each with its reason: Config.Exclude, the OS ephemeral range
// (unless Config.AllowEphemeralOverlap), the ranges the OS keeps for itself
// (Windows' excluded port ranges), net.ipv4.ip_local_reserved_ports (Linux)
// and the ports browsers refuse (unless Config.AllowBrowserRestricted). It
// reads the OS's lists now; one that cannot be read is left out and its
// error returned with the rest.
func Exclusions(cfg Config) ([]Exclusion, error) {
	var (
		out  []Exclusion
		errs []error
	)
	if len(cfg.Exclude) > 0 {
		out = append(out, Exclusion{Ports: cfg.Exclude, Source: "Config.Exclude (" + EnvPortExclude + ")", Why: "configured"})
	}
	if !cfg.AllowEphemeralOverlap {
		eph, err := portrange.Ephemeral()
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, Exclusion{Ports: []Range{Range(eph)}, Source: "the OS ephemeral range",
			Why: "the OS picks outgoing connections' local ports from it; " + EnvAllowEphemeralOverlap + "=true keeps it"})
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
		rs := make([]Range, len(browserRestricted))
		for i, p := range browserRestricted {
			rs[i] = Range{First: p, Last: p}
		}
		out = append(out, Exclusion{Ports: rs, Source: "web browsers' restricted ports",
			Why: "Chromium and Firefox refuse to connect to them; skipped in Prefer lists too; " + EnvAllowBrowserRestricted + "=true keeps them"})
	}
	return out, joinErrs(errs)
}

// joinErrs is errors.Join of errs, with one prefix; nil for none.
func joinErrs(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return opError("exclusions", errors.Join(errs...))
}
