package portalloc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/store"
)

// Which ports an Allocator hands out: its range, less Config.Exclude, the
// ports the administrator reserves (Linux's ip_local_reserved_ports), the
// ports browsers refuse (unless Config.AllowBrowserRestricted), the OS
// ephemeral range (unless Config.AllowEphemeralOverlap) and the ports the
// OS keeps for itself (Windows's excluded ranges). New reads them once.

var ephemeralWarning sync.Once

// excluded is what an Allocator leaves out besides Config.Exclude, read
// once by New.
type excluded struct {
	local   []portrange.Range // net.ipv4.ip_local_reserved_ports
	browser bool              // the browsers' restricted ports are left out
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

// candidateSet is the range less everything left out.
func candidateSet(cfg Config, excl excluded) (*portrange.Set, error) {
	var exclude []portrange.Range
	for _, r := range cfg.Exclude {
		exclude = append(exclude, portrange.Range(r))
	}
	rng := portrange.Range(cfg.Range)
	if !cfg.AllowEphemeralOverlap {
		eph, err := portrange.Ephemeral()
		if err != nil {
			cfg.Logger.Info("could not read the OS ephemeral port range; assuming the IANA range", "range", eph.String(), "error", err.Error())
		}
		if rng.Overlaps(eph) {
			ephemeralWarning.Do(func() {
				cfg.Logger.Info("the port range overlaps the OS ephemeral range; leaving the overlap out (set Config.AllowEphemeralOverlap or BERTH_ALLOW_EPHEMERAL_OVERLAP=true to keep it)",
					"range", cfg.Range.String(), "ephemeral", eph.String())
			})
			exclude = append(exclude, eph)
		}
	}
	reserved, err := portrange.ReservedByOS()
	if err != nil {
		cfg.Logger.Info("could not read the ports the OS reserves", "error", err.Error())
	}
	exclude = append(exclude, reserved...)
	exclude = append(exclude, excl.local...)
	if excl.browser {
		exclude = append(exclude, portrange.BrowserRestrictedRanges()...)
	}
	set := portrange.NewSet(rng, exclude...)
	if set.Len() == 0 {
		return nil, &store.FieldError{Field: "Config.Range", Value: cfg.Range.String(),
			Want: "a range with ports left after Config.Exclude, the OS ephemeral range and the ports the OS reserves; widen it (Config.Range, BERTH_PORT_RANGE or --range), or set Config.AllowEphemeralOverlap (BERTH_ALLOW_EPHEMERAL_OVERLAP=true) to keep the overlap"}
	}
	return set, nil
}

// refuseLocal refuses port, named field, when the administrator reserves
// it, unless allow: a port of ip_local_reserved_ports is kept for other
// software, which may bind it at any time.
func (e excluded) refuseLocal(field string, port uint16, allow bool) error {
	if allow || !slices.ContainsFunc(e.local, func(r portrange.Range) bool { return r.Contains(port) }) {
		return nil
	}
	list := make([]string, len(e.local))
	for i, r := range e.local {
		list[i] = r.String()
	}
	return &store.FieldError{Field: field, Value: fmt.Sprint(port),
		Want: fmt.Sprintf("a port outside net.ipv4.ip_local_reserved_ports (%s), which the administrator keeps for other software; set Request.AllowOSReserved to take it anyway", strings.Join(list, ","))}
}

// candidates returns the walk over set in req's order, led by req's
// preferred ports and, before them, the sticky port of a sticky request as
// the store remembers it (returned too; 0 when there is none).
func (a *Allocator) candidates(ctx context.Context, req Request, set *portrange.Set) (func() (uint16, bool), uint16) {
	var it *portrange.Iter
	if req.Order == OrderLowest {
		it = set.Lowest()
	} else if seeded := scopeSeed(a.cfg.Scope, req.unscoped); seeded != nil {
		it = set.Candidates(seeded)
	} else {
		a.rngMu.Lock()
		it = set.Candidates(a.rng)
		a.rngMu.Unlock()
	}
	next := it.Next
	if len(req.Prefer) > 0 {
		prefer := req.Prefer
		next = func() (uint16, bool) {
			for len(prefer) > 0 {
				p := prefer[0]
				prefer = prefer[1:]
				if a.excl.browser && portrange.IsBrowserRestricted(p) {
					a.log.Info("skipping a preferred port that web browsers refuse to connect to (set Config.AllowBrowserRestricted or BERTH_ALLOW_BROWSER_RESTRICTED=true to allow it)", "port", p)
					continue
				}
				return p, true
			}
			return it.Next()
		}
	}
	p := a.stickyPort(ctx, req, set)
	if p == 0 {
		return next, 0
	}
	first := true
	return func() (uint16, bool) {
		if first {
			first = false
			return p, true
		}
		return next()
	}, p
}

// stickyPort returns the port a sticky request had last time as the store
// remembers it, when it is still in set; 0 otherwise.
func (a *Allocator) stickyPort(ctx context.Context, req Request, set *portrange.Set) uint16 {
	s := a.h.store()
	if !req.Sticky || s == nil {
		return 0
	}
	p, ok, err := s.Recall(ctx, req.Label, req.Protocol)
	switch {
	case err != nil:
		a.log.Error(err, "could not recall the sticky port; allocating afresh", "label", req.Label)
		return 0
	case !ok:
		return 0
	case !set.Contains(p):
		a.log.Info("sticky port is outside the range now; allocating afresh", "label", req.Label, "port", p, "range", a.cfg.Range.String())
		return 0
	}
	return p
}

// remember records a sticky request's port, and logs when it is not the
// one it had before.
func (a *Allocator) remember(ctx context.Context, req Request, sticky, got uint16) {
	s := a.h.store()
	if !req.Sticky || s == nil {
		return
	}
	if sticky != 0 && sticky != got {
		a.log.Info("sticky port was not free (held or bound by another process); allocated another", "label", req.Label, "was", sticky, "now", got)
	}
	if err := s.Remember(ctx, req.Label, req.Protocol, got); err != nil {
		a.log.Error(err, "could not remember the sticky port", "label", req.Label)
	}
}
