package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/store"
)

// Reserve deletes the conflicting rows of exited owners and ended leases
// (counted as reaped). No probe runs for a key req.Owner holds already: it
// may be listening on the port.
func (s *sqlStore) Reserve(ctx context.Context, req store.Request) (store.Reservation, error) {
	req, err := req.Validate(s.self)
	if err != nil {
		return store.Reservation{}, err
	}
	lease, err := grant(req.Owner.Holder, req.TTL)
	if err != nil {
		return store.Reservation{}, err
	}
	key, own := req.Key, req.Owner
	var res store.Reservation
	err = s.write(ctx, "reserve "+key.String(), func(tctx context.Context) error {
		rows, err := s.conflictRows(tctx, key)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.Key == key && r.Owner.Same(own) && (lease == nil || leaseLive(r)) {
				if lease != nil {
					// The holder asks again: its lease starts over.
					res, err = s.extend(tctx, r, lease)
					return err
				}
				res = r
				if r.Label == "" && req.Label != "" {
					// A row put back without its label gets it from the holder.
					return s.relabel(tctx, &res, req.Label)
				}
				return nil
			}
		}
		if err := s.clearDead(tctx, key, own, rows); err != nil {
			return err
		}
		if err := s.probe(req.Probe, key); err != nil {
			return err
		}
		res, err = s.insert(tctx, key, own, req.Label, req.Kind, lease)
		return err
	})
	return res, err
}

// Scan deletes rows of exited owners in the way; a row that cannot be
// deleted only costs its own candidate.
func (s *sqlStore) Scan(ctx context.Context, req store.ScanRequest) (store.Reservation, error) {
	rs, err := s.scan(ctx, req, 1)
	if err != nil {
		return store.Reservation{}, err
	}
	return rs[0], nil
}

// ScanBlock skips a base whose block would pass port 65535, and returns the
// reservations in port order.
func (s *sqlStore) ScanBlock(ctx context.Context, req store.ScanRequest, n int) ([]store.Reservation, error) {
	if n < 1 || n > store.MaxBlock {
		return nil, &store.FieldError{Field: "n", Value: fmt.Sprint(n), Want: fmt.Sprintf("a block of 1 to %d ports", store.MaxBlock)}
	}
	return s.scan(ctx, req, n)
}

func (s *sqlStore) scan(ctx context.Context, req store.ScanRequest, n int) ([]store.Reservation, error) {
	req, err := req.Validate(s.self)
	if err != nil {
		return nil, err
	}
	lease, err := grant(req.Owner.Holder, req.TTL)
	if err != nil {
		return nil, err
	}
	op, what := "scan", string(req.Protocol)
	if n > 1 {
		op, what = "scan block", fmt.Sprintf("a block of %d %s ports", n, req.Protocol)
	}
	key := store.Key{Protocol: req.Protocol, Addr: req.Addr}
	var (
		res       []store.Reservation
		exhausted bool
		// skipped are candidates whose holder the store remembered alive;
		// it may have died since: they are checked again before exhaustion.
		skipped    []uint16
		rechecking bool
		freshSince = time.Now().Add(-liveTTL)
		next       = req.Next
	)
	for res == nil && !exhausted {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		err := s.write(ctx, op, func(tctx context.Context) error {
			if err := s.fresh(tctx); err != nil {
				return storageErr(op, err)
			}
			for checked := 0; checked < req.Batch; {
				if err := ctx.Err(); err != nil {
					return err
				}
				base, ok := next()
				if !ok && !rechecking && len(skipped) > 0 {
					rechecking, freshSince = true, time.Now()
					next = func() (uint16, bool) {
						if len(skipped) == 0 {
							return 0, false
						}
						p := skipped[0]
						skipped = skipped[1:]
						return p, true
					}
					base, ok = next()
				}
				if !ok {
					exhausted = true
					return nil // commit the rows reaped on the way
				}
				if base == 0 || int(base)+n-1 > 65535 {
					continue
				}
				held, free, err := s.blockFree(tctx, key, req.Owner, base, n, freshSince, req.Probe)
				if err != nil {
					return err
				}
				if held {
					if !rechecking {
						skipped = append(skipped, base)
					}
					continue
				}
				checked++
				if !free {
					continue
				}
				rs := make([]store.Reservation, 0, n)
				for i := range n {
					key.Port = base + uint16(i)
					r, err := s.insert(tctx, key, req.Owner, req.Label, req.Kind, lease)
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
		return nil, fmt.Errorf("scan for %s on %s: %w", what, key.Addr, store.ErrExhausted)
	}
	return res, nil
}

// blockFree judges the ports base..base+n-1 for own: held when a live
// owner holds one as far as the store remembers (a hint, to skip it); else
// free when each may be reserved (rows in the way reaped) and passes the probe.
func (s *sqlStore) blockFree(tctx context.Context, key store.Key, own store.Owner, base uint16, n int, freshSince time.Time, probe func(store.Key) error) (held, free bool, err error) {
	inWay := make([][]store.Reservation, n)
	for i := range n {
		key.Port = base + uint16(i)
		rows, fromTable, err := s.holders(tctx, key)
		if err != nil {
			return false, false, storageErr("look up "+key.String(), err)
		}
		for _, r := range rows {
			if s.rowAlive(tctx, r, freshSince) {
				return true, false, nil
			}
		}
		if !fromTable {
			// The view called it free: check against the table itself, so
			// that a slip in keeping the view in step can never become a
			// double grant.
			if rows, err = s.conflictRows(tctx, key); err != nil {
				return false, false, err
			}
		}
		inWay[i] = rows
	}
	for i := range n {
		key.Port = base + uint16(i)
		if err := s.clearDead(tctx, key, own, inWay[i]); err != nil {
			if !errors.Is(err, store.ErrHeld) {
				// Another candidate will do; this row waits for the sweep.
				s.log.Error(err, "could not reap a row in the way", "key", key.String())
			}
			return false, false, nil
		}
	}
	for i := range n {
		key.Port = base + uint16(i)
		if err := s.probe(probe, key); errors.Is(err, store.ErrHeld) {
			return false, false, nil
		} else if err != nil {
			return false, false, err
		}
	}
	return false, true, nil
}

// probe runs the caller's probe, if any, and counts a port it refuses.
func (s *sqlStore) probe(probe func(store.Key) error, key store.Key) error {
	if probe == nil {
		return nil
	}
	err := probe(key)
	if errors.Is(err, store.ErrHeld) {
		s.probeFailures.Add(1)
		s.log.V(1).Info("port held outside this store", "key", key.String(), "why", err.Error())
	} else if err != nil {
		err = fmt.Errorf("probe %s: %w", key, err)
	}
	return err
}

func (s *sqlStore) conflictRows(ctx context.Context, key store.Key) ([]store.Reservation, error) {
	rows, err := s.rowsOf(ctx, func(r store.Reservation) bool { return netaddr.Conflicts(r.Addr, key.Addr) },
		qConflicts, string(key.Protocol), int(key.Port))
	if err != nil {
		return nil, storageErr("look up "+key.String(), err)
	}
	return rows, nil
}

// clearDead deletes the rows in key's way, unless a live owner holds one:
// then it returns a *store.ConflictError.
func (s *sqlStore) clearDead(ctx context.Context, key store.Key, own store.Owner, rows []store.Reservation) error {
	now := time.Now()
	for _, r := range rows {
		if s.rowAlive(ctx, r, now) {
			return &store.ConflictError{Key: key, Holder: r, Self: r.Owner.Same(own)}
		}
	}
	for _, r := range rows {
		if _, err := s.st.exec(ctx, qDeleteKey, keyArgs(r.Key)...); err != nil {
			return storageErr("reap "+r.String(), err)
		}
		s.cache.remove(r.Key)
		s.reaped.Add(1)
		s.log.V(1).Info("reaped reservation of exited owner", "key", r.String(), "owner", r.Owner.String())
	}
	return nil
}

// insert inserts a row for own, or, with a lease, for its holder.
func (s *sqlStore) insert(ctx context.Context, key store.Key, own store.Owner, label string, kind store.Kind, lease *leaseGrant) (store.Reservation, error) {
	now := s.now()
	r := store.Reservation{Key: key, Owner: own, Label: label, Kind: kind, Created: time.Unix(0, now.UnixNano())}
	stored, until := own, int64(0)
	if lease != nil {
		stored, until = lease.stored(), lease.until
		r.Expires = lease.expires
	}
	if _, err := s.st.exec(ctx, qInsert, append(keyArgs(key),
		stored.PID, stored.Start, stored.Namespace, stored.Name, label, string(kind), now.UnixNano(), until)...); err != nil {
		return store.Reservation{}, storageErr("insert "+key.String(), err)
	}
	s.cache.add(r)
	return r, nil
}

func (s *sqlStore) relabel(ctx context.Context, r *store.Reservation, label string) error {
	if _, err := s.st.exec(ctx, qRelabel, append([]any{label}, keyArgs(r.Key)...)...); err != nil {
		return storageErr("label "+r.String(), err)
	}
	r.Label = label
	s.cache.remove(r.Key)
	return nil
}
