package portalloc

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/berth-go/berth/store"
)

// Counts counts by the kind of an allocation, as Kubernetes' port
// allocator labels its metrics: Dynamic for Allocate (berth chose the
// port), Static for Reserve (the caller named it).
type Counts struct {
	Dynamic int64
	Static  int64
}

// Stats are an Allocator's counters since New, what it holds now, and the
// counters of the store it shares with the process's other Allocators.
type Stats struct {
	// Held is how many reservations this Allocator holds now.
	Held int
	// Ports is how many ports Allocate may hand out: the range less
	// everything left out of it.
	Ports int
	// Allocations counts successful Allocate and Reserve calls; Errors
	// failed ones, whatever the cause.
	Allocations, Errors Counts
	// Fallbacks counts this Allocator's switches from the state store to
	// the MRU file; Fallback says why it serves from the MRU file now, ""
	// when it serves from the store (and in ModeMRU).
	Fallbacks int64
	Fallback  string
	// The store's: ProbeFailures counts candidates free in the store that
	// another process's lock or bind refused; Reaped rows of exited owners
	// deleted.
	ProbeFailures, Reaped int64
	// Restored counts the process's reservations put back in the store
	// after it lost them (a file deleted, replaced or truncated, a
	// failover); Lost those another owner's row stood in the way of (each
	// logged as an error naming both; their locks still keep the ports);
	// Rereleased the releases done again where a failover brought a row
	// back or a release had failed.
	Restored, Lost, Rereleased int64
}

// counters are the Allocator's own counts.
type counters struct {
	alloc, allocErr Counts // updated atomically
	fallbacks       atomic.Int64
}

func (c *counters) count(kind store.Kind, err error) {
	if errors.Is(err, store.ErrClosed) {
		return
	}
	n := &c.alloc
	if err != nil {
		n = &c.allocErr
	}
	if kind == store.Static {
		atomic.AddInt64(&n.Static, 1)
	} else {
		atomic.AddInt64(&n.Dynamic, 1)
	}
}

// Stats returns the Allocator's counters. It takes no lock of the store
// and does no I/O: it is cheap enough for every scrape.
func (a *Allocator) Stats() Stats {
	st := Stats{
		Held:  len(a.Held()),
		Ports: a.set.Len(),
		Allocations: Counts{
			Dynamic: atomic.LoadInt64(&a.ctr.alloc.Dynamic),
			Static:  atomic.LoadInt64(&a.ctr.alloc.Static),
		},
		Errors: Counts{
			Dynamic: atomic.LoadInt64(&a.ctr.allocErr.Dynamic),
			Static:  atomic.LoadInt64(&a.ctr.allocErr.Static),
		},
		Fallbacks:  a.ctr.fallbacks.Load(),
		Restored:   a.h.restored.Load(),
		Lost:       a.h.lost.Load(),
		Rereleased: a.h.rereleased.Load(),
	}
	if s := a.h.store(); s != nil {
		ss := s.Stats()
		st.ProbeFailures, st.Reaped = ss.ProbeFailures, ss.Reaped
	} else if a.cfg.Mode == ModeStateStoreWithFallback {
		st.Fallback = "the state store cannot be used"
		if err := a.h.downNow(); err != nil {
			st.Fallback = err.Error()
		}
	}
	return st
}

// Usage returns how many ports Allocate may hand out, and how many of them
// have a live reservation in the store now (any owner's): the range's use,
// read from the store. Served from the MRU file, it reports the ports
// only.
func (a *Allocator) Usage(ctx context.Context) (ports, reserved int, err error) {
	if a.closed.Load() {
		return 0, 0, opError("usage", store.ErrClosed)
	}
	ports = a.set.Len()
	s := a.h.store()
	if s == nil {
		return ports, 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	rows, err := s.List(ctx, store.Filter{})
	if err != nil {
		return 0, 0, opError("usage", err)
	}
	seen := map[uint16]bool{}
	for _, r := range rows {
		if a.set.Contains(r.Port) && !seen[r.Port] && r.Live(ctx) {
			seen[r.Port] = true
			reserved++
		}
	}
	return ports, reserved, nil
}
