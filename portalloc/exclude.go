package portalloc

import (
	"fmt"
	"slices"
	"strings"

	"github.com/berth-go/berth/internal/portrange"
)

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
		out = append(out, portrange.BrowserRestrictedRanges()...)
	}
	return out
}

func (e excluded) localHas(p uint16) bool {
	return slices.ContainsFunc(e.local, func(r portrange.Range) bool { return r.Contains(p) })
}

func (e excluded) browserHas(p uint16) bool {
	return e.browser && portrange.IsBrowserRestricted(p)
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
