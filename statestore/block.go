package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/store"
)

// MaxBlock is the most ports ScanBlock reserves in one block.
const MaxBlock = store.MaxBlock

// ScanBlock reserves n consecutive ports, base to base+n-1, for the first
// candidate base whose ports no live reservation conflicts with and whose
// every port passes the probe. The n rows are inserted in one transaction:
// all of them, or none. req.Next yields the candidate bases; a base whose
// block would pass port 65535 is skipped. It returns the reservations in
// port order, or an error wrapping ErrExhausted when the candidates run out.
// Rows of exited owners in the way are deleted, as Scan does.
func (s *Store) ScanBlock(ctx context.Context, req ScanRequest, n int) ([]Reservation, error) {
	if err := store.CheckBlock(n); err != nil {
		return nil, err
	}
	if err := store.CheckProcessOwner(req.Owner); err != nil {
		return nil, err
	}
	key, own, kind, batch, err := s.checkScan(req)
	if err != nil {
		return nil, err
	}
	var (
		res       []Reservation
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
				rs := make([]Reservation, 0, n)
				for i := range n {
					k := key
					k.Port = base + uint16(i)
					r, err := s.insert(tctx, k, own, req.Label, kind, nil)
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
		return nil, fmt.Errorf("scan for a block of %d %s ports on %s: %w", n, req.Protocol, key.Addr, ErrExhausted)
	}
	return res, nil
}

// blockFree reports whether every port of the block base..base+n-1 may be
// reserved for own: no live holder (rows of exited owners are deleted on
// the way) and the probe passes. The in-memory view rules out held ports
// first, before any table read or probe.
func (s *Store) blockFree(tctx context.Context, key Key, own Owner, base uint16, n int, freshSince time.Time, probe ProbeFunc) (bool, error) {
	held := make([][]Reservation, n)
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
			if !errors.Is(err, ErrHeld) {
				s.log.Error(err, "could not reap a row in the way", "key", key.String())
			}
			return false, nil
		}
	}
	for i := range n {
		key.Port = base + uint16(i)
		if free, err := s.probe(probe, key); err != nil || !free {
			return false, err
		}
	}
	return true, nil
}
