package portalloc

import (
	"context"
	"errors"
	"sync/atomic"
)

// ScopeCounts counts by the scope of an allocation, as Kubernetes' port
// allocator labels its metrics: Dynamic for Allocate (berth chose the port),
// Static for Reserve (the caller named it).
type ScopeCounts struct {
	Dynamic int64
	Static  int64
}

// Stats are an Allocator's counters since New, and what it holds now.
type Stats struct {
	// Backend serves new allocations now: BackendStateStore or BackendMRU.
	Backend string
	// Held is how many reservations this Allocator holds now.
	Held int
	// Allocations counts successful Allocate (Dynamic) and Reserve
	// (Static) calls.
	Allocations ScopeCounts
	// Errors counts failed Allocate and Reserve calls, whatever the cause
	// (a held port, an exhausted range, bad input, a cancelled context).
	Errors ScopeCounts
	// ProbeFailures counts candidates that no reservation held but that
	// were bound by a process outside berth.
	ProbeFailures int64
	// Reaped counts rows of exited owners this Allocator's store deleted.
	Reaped int64
	// Fallbacks counts switches from the state store to the MRU backend.
	// After a fallback the Allocator tries the store again every
	// 5 seconds, so a store that heals and fails again counts
	// again.
	Fallbacks int64
	// Blind counts ports the MRU backend handed out while the state store
	// could not even be read, so without skipping the ports it holds: such
	// a port may be one another process has reserved. Only ModeMRU serves
	// blind; in ModeStateStoreWithFallback such a call fails instead.
	Blind int64
	// Restored counts reservations this Allocator put back in its state
	// store after the store's file was lost (deleted, replaced or
	// truncated); Lost counts those it could not put back, because
	// another process had taken the port meanwhile (each is logged as an
	// error naming both owners).
	//
	// On a fleet's store (Config.StoreDSN) they count the reservations put
	// back after they went missing from it (lost in a failover to a
	// standby that had not received them, or deleted by a forced
	// retirement) and those another process had taken meanwhile; such a
	// one is tried, logged and counted again at each comparison (every
	// lease renewal) while the other process holds it.
	Restored, Lost int64
	// Rereleased counts releases of this Allocator done again on a
	// fleet's store: undone by a failover (the row came back) or failed
	// while the store could not be reached.
	Rereleased int64
}

// counters are the Allocator's own counts; the store keeps the rest.
type counters struct {
	alloc, allocErr  ScopeCounts // updated atomically
	mruProbeFailures atomic.Int64
	fallbacks        atomic.Int64
	blind            atomic.Int64
	restored, lost   atomic.Int64
	rereleased       atomic.Int64
}

func (c *counters) count(static bool, err error) {
	if errors.Is(err, ErrClosed) {
		return
	}
	n := &c.alloc
	if err != nil {
		n = &c.allocErr
	}
	if static {
		atomic.AddInt64(&n.Static, 1)
	} else {
		atomic.AddInt64(&n.Dynamic, 1)
	}
}

// Stats returns the Allocator's counters. It takes no lock on the store and
// does no I/O: it is cheap enough for every scrape.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	held := len(a.held)
	a.mu.Unlock()
	st := Stats{
		Backend: a.Backend(),
		Held:    held,
		Allocations: ScopeCounts{
			Dynamic: atomic.LoadInt64(&a.ctr.alloc.Dynamic),
			Static:  atomic.LoadInt64(&a.ctr.alloc.Static),
		},
		Errors: ScopeCounts{
			Dynamic: atomic.LoadInt64(&a.ctr.allocErr.Dynamic),
			Static:  atomic.LoadInt64(&a.ctr.allocErr.Static),
		},
		ProbeFailures: a.ctr.mruProbeFailures.Load(),
		Fallbacks:     a.ctr.fallbacks.Load(),
		Blind:         a.ctr.blind.Load(),
		Restored:      a.ctr.restored.Load(),
		Lost:          a.ctr.lost.Load(),
		Rereleased:    a.ctr.rereleased.Load(),
	}
	if s := a.db(); s != nil {
		ss := s.Stats()
		st.ProbeFailures += ss.ProbeFailures
		st.Reaped = ss.Reaped
	}
	return st
}

// usage returns how many ports Allocate may hand out, and how many of
// them have a reservation in the store (package expvarmetrics' Usage).
// In the MRU backend it reports only the ports. Its errors have no
// prefix: ReadUsage adds it.
func (a *Allocator) usage(ctx context.Context) (ports, reserved int, err error) {
	if a.isClosed() {
		return 0, 0, ErrClosed
	}
	ports = a.set.Len()
	s := a.db()
	if s == nil || a.fb.active.Load() {
		return ports, 0, nil
	}
	rows, err := s.ReservedPorts(ctx, a.cfg.Range.First, a.cfg.Range.Last)
	if err != nil {
		return 0, 0, a.closedErr(err)
	}
	for _, p := range rows {
		if a.set.Contains(p) {
			reserved++
		}
	}
	return ports, reserved, nil
}
