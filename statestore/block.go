package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/store"
)

// ScanBlock reserves n consecutive ports, base to base+n-1, for the first
// candidate base whose ports no live reservation conflicts with and whose
// every port passes the probe. The n rows are inserted in one transaction:
// all of them, or none. req.Next yields the candidate bases; a base whose
// block would pass port 65535 is skipped. It returns the reservations in
// port order, or an error wrapping store.ErrExhausted when the candidates run out.
// Rows of exited owners in the way are deleted, as Scan does.
func (s *sqlStore) ScanBlock(ctx context.Context, req store.ScanRequest, n int) ([]store.Reservation, error) {
	if n < 1 || n > store.MaxBlock {
		return nil, &store.FieldError{Field: "n", Value: fmt.Sprint(n), Want: fmt.Sprintf("a block of 1 to %d ports", store.MaxBlock)}
	}
	req, err := req.Validate(s.self)
	if err != nil {
		return nil, err
	}
	lease, err := grant(req.Owner.Holder, req.TTL)
	if err != nil {
		return nil, err
	}
	key, own, kind, batch := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: 1}, req.Owner, req.Kind, req.Batch
	var (
		res       []store.Reservation
		exhausted bool
	)
	for res == nil && !exhausted {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		err := s.write(ctx, "scan block", func(tctx context.Context) error {
			if err := s.fresh(tctx); err != nil {
				return storageErr("scan block", err)
			}
			freshSince := time.Now().Add(-liveTTL)
			for checked := 0; checked < batch; {
				if err := ctx.Err(); err != nil {
					return err
				}
				base, ok := req.Next()
				if !ok {
					exhausted = true
					return nil // commit the rows reaped on the way
				}
				if base == 0 || int(base)+n-1 > 65535 {
					continue
				}
				free, err := s.blockFree(tctx, key, own, base, n, freshSince, req.Probe)
				if err != nil {
					return err
				}
				checked++
				if !free {
					continue
				}
				rs := make([]store.Reservation, 0, n)
				for i := range n {
					k := key
					k.Port = base + uint16(i)
					r, err := s.insert(tctx, k, own, req.Label, kind, lease)
					if err != nil {
						return err // the transaction rolls back: none of the block stays
					}
					rs = append(rs, r)
				}
				res = rs
				return nil
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if res == nil {
		return nil, fmt.Errorf("scan for a block of %d %s ports on %s: %w", n, req.Protocol, key.Addr, store.ErrExhausted)
	}
	return res, nil
}

// blockFree reports whether every port of the block base..base+n-1 may be
// reserved for own: no live holder (rows of exited owners are deleted on
// the way) and the probe passes. The in-memory view rules out held ports
// first, before any table read or probe.
func (s *sqlStore) blockFree(tctx context.Context, key store.Key, own store.Owner, base uint16, n int, freshSince time.Time, probe func(store.Key) error) (bool, error) {
	held := make([][]store.Reservation, n)
	for i := range n {
		key.Port = base + uint16(i)
		rows, fromTable, err := s.holders(tctx, key)
		if err != nil {
			return false, storageErr("look up "+key.String(), err)
		}
		if s.heldLive(tctx, rows, freshSince) {
			return false, nil
		}
		if !fromTable {
			// Checked against the table itself, as Scan does: a slip of
			// the view never becomes a double grant.
			if rows, err = s.conflictRows(tctx, key); err != nil {
				return false, err
			}
		}
		held[i] = rows
	}
	for i := range n {
		key.Port = base + uint16(i)
		if err := s.clearDead(tctx, key, own, held[i]); err != nil {
			if !errors.Is(err, store.ErrHeld) {
				s.log.Error(err, "could not reap a row in the way", "key", key.String())
			}
			return false, nil
		}
	}
	for i := range n {
		key.Port = base + uint16(i)
		if err := s.probe(probe, key); errors.Is(err, store.ErrHeld) {
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	return true, nil
}
