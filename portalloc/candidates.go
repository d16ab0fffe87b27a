package portalloc

import (
	"context"
	"sync"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/store"
)

var ephemeralWarning sync.Once

// candidateSet is the range less exclusions, the OS ephemeral range (unless
// allowed) and the ports the OS reserves for itself.
func candidateSet(cfg Config, excl excluded) (*portrange.Set, error) {
	exclude := internalRanges(cfg.Exclude)
	if !cfg.AllowEphemeralOverlap {
		eph, err := portrange.Ephemeral()
		if err != nil {
			cfg.Logger.Info("could not read the OS ephemeral port range; assuming the IANA range", "range", eph.String(), "error", err.Error())
		}
		if cfg.Range.Overlaps(Range(eph)) {
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
	exclude = append(exclude, excl.ranges()...) // ip_local_reserved_ports, browsers' restricted ports
	set := portrange.NewSet(portrange.Range(cfg.Range), exclude...)
	if set.Len() == 0 {
		return nil, &FieldError{Field: "Config.Range", Value: cfg.Range.String(),
			Want: "a range with ports left after Config.Exclude, the OS ephemeral range and the ports the OS reserves; widen it (Config.Range, BERTH_PORT_RANGE or --range), or set Config.AllowEphemeralOverlap (BERTH_ALLOW_EPHEMERAL_OVERLAP=true) to keep the overlap"}
	}
	return set, nil
}

// candidates returns the walk over the range in req's order, led by req's
// preferred ports and, before them, the sticky port of a sticky request (0
// when there is none) as s remembers it.
func (a *Allocator) candidates(ctx context.Context, s store.Store, req Request, set *portrange.Set) (func() (uint16, bool), uint16) {
	var it *portrange.Iter
	if req.Order == OrderLowest {
		it = set.Lowest()
	} else if seeded := a.scopeSeed(req); seeded != nil {
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
				if !a.skipPreferred(p) {
					return p, true
				}
			}
			return it.Next()
		}
	}
	p := a.stickyPort(ctx, s, req, set)
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

// stickyPort returns the port a sticky request had last time as s
// remembers it, when it is still in set; 0 otherwise.
func (a *Allocator) stickyPort(ctx context.Context, s store.Store, req Request, set *portrange.Set) uint16 {
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
func (a *Allocator) remember(ctx context.Context, s store.Store, req Request, sticky, got uint16) {
	if !req.Sticky {
		return
	}
	if sticky != 0 && sticky != got {
		a.log.Info("sticky port was not free (held or bound by another process); allocated another", "label", req.Label, "was", sticky, "now", got)
	}
	if err := s.Remember(ctx, req.Label, req.Protocol, got); err != nil {
		a.log.Error(err, "could not remember the sticky port", "label", req.Label)
	}
}
