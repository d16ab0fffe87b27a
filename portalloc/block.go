package portalloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/berth-go/berth/store"
)

// AllocateBlock reserves n consecutive ports of the range, a base port and
// the n-1 after it, for software configured by a base port (a node that
// listens on base, base+1 and base+2; an RTP media range). Every port of
// the block is free in the store and bind-probed, and the n reservations
// are made in one transaction: all of them or none. Bases come in req's
// order, preferred bases (Request.Prefer) first; a block lies wholly in
// the range unless its base is a preferred one. The reservations are
// returned in port order and are released one by one, like any others.
//
// It needs the state store: when the Allocator serves from the MRU file,
// which remembers single ports only, it returns an error wrapping
// ErrStoreUnavailable. With no free block it returns an error wrapping
// ErrRangeExhausted.
func (a *Allocator) AllocateBlock(ctx context.Context, req Request, n int) (rs []Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	defer func() { err = opError("allocate", err) }()
	if n < 1 || n > store.MaxBlock {
		return nil, &FieldError{Field: "n", Value: strconv.Itoa(n), Want: fmt.Sprintf("a block of 1 to %d ports (store.MaxBlock)", store.MaxBlock)}
	}
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if req.Sticky {
		return nil, &FieldError{Field: "Request.Sticky", Value: "true", Want: "false: a block cannot be sticky; give its base port in Request.Prefer instead"}
	}
	a.retryStore(ctx)
	for attempt := 0; ; attempt++ {
		s := a.db()
		if s == nil || a.fb.active.Load() {
			why := "Config.Mode is mru"
			if cause := a.FallbackCause(); cause != nil {
				why = cause.Error()
			}
			return nil, fmt.Errorf("block of %d ports: %w (%s), and the MRU file serves single ports only", n, ErrStoreUnavailable, why)
		}
		next, _ := a.candidates(ctx, s, req, a.set)
		whole := func() (uint16, bool) {
			for {
				base, ok := next()
				if !ok || slices.Contains(req.Prefer, base) || a.blockInSet(base, n) {
					return base, ok
				}
			}
		}
		probe := probeFunc(req)
		a.repairMu.RLock() // from the insert to the hold (see repairMu)
		rows, err := s.ScanBlock(ctx, store.ScanRequest{
			Protocol: req.Protocol,
			Addr:     req.Addr,
			Label:    req.Label,
			Next:     whole,
			Probe:    func(k store.Key) (bool, error) { return probe(k.Port) },
		}, n)
		if err == nil {
			rs, err := a.holdBlock(ctx, s, req, rows)
			a.repairMu.RUnlock()
			return rs, err
		}
		a.repairMu.RUnlock()
		if attempt < maxReplacements {
			var again bool
			if again, err = a.replaced(ctx, s, err); again {
				continue
			}
		}
		if errors.Is(err, store.ErrExhausted) {
			return nil, fmt.Errorf("block of %d %s ports on %s in %s: %w", n, req.Protocol, req.Addr, a.cfg.Range, ErrRangeExhausted)
		}
		if serr := a.storeErr(ctx, err, req); serr != nil {
			return nil, serr
		}
		return nil, fmt.Errorf("block of %d ports: %w: %w", n, ErrStoreUnavailable, err)
	}
}

// blockInSet reports whether base..base+n-1 all lie in the candidate set.
func (a *Allocator) blockInSet(base uint16, n int) bool {
	if int(base)+n-1 > 65535 {
		return false
	}
	for i := range n {
		if !a.set.Contains(base + uint16(i)) {
			return false
		}
	}
	return true
}

// holdBlock takes this Allocator's hold of each new row of a block; if the
// Allocator closed meanwhile, the rows it could not hold are released
// (those held before Close began, Close releases).
func (a *Allocator) holdBlock(ctx context.Context, s store.Store, req Request, rows []store.Reservation) ([]Reservation, error) {
	rs := make([]Reservation, len(rows))
	for i, row := range rows {
		rs[i] = Reservation{Protocol: req.Protocol, Addr: row.Addr, Port: row.Port, Label: req.Label, Backend: BackendStateStore}
	}
	for i, r := range rs {
		if !a.holdNew(ctx, s, r, "") {
			for _, r := range rs[i+1:] {
				_ = s.Release(context.WithoutCancel(ctx), storeKey(r), store.Owner{}) // reaping covers a failure
			}
			return nil, ErrClosed
		}
	}
	return rs, nil
}
