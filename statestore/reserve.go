package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/store"
)

// Reserve reserves req.Key for req.Owner.
//
// Rows of exited owners and ended leases that conflict are deleted (and
// counted as reaped). When req.Owner already holds exactly req.Key, its
// existing row is returned and no probe runs: the owner may be listening on
// the port already (a holder's lease starts over). Any other live conflict
// is a *store.ConflictError naming the holder; it says so when the holder
// is req.Owner itself.
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
					// A row put back without its label gets it from the
					// holder.
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

// Scan reserves the first candidate that no live reservation conflicts with
// and that passes the probe. It returns an error wrapping store.ErrExhausted
// when Next runs out first. Rows of exited owners in the way are deleted; a
// row that cannot be deleted only costs its own candidate.
func (s *sqlStore) Scan(ctx context.Context, req store.ScanRequest) (store.Reservation, error) {
	req, err := req.Validate(s.self)
	if err != nil {
		return store.Reservation{}, err
	}
	lease, err := grant(req.Owner.Holder, req.TTL)
	if err != nil {
		return store.Reservation{}, err
	}
	key, own, kind, batch := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: 1}, req.Owner, req.Kind, req.Batch
	var (
		res       store.Reservation
		found     bool
		exhausted bool
		// skipped are candidates passed over because the store remembered
		// their holder alive. A holder may have died since: before the
		// scan reports exhaustion it checks them again with fresh liveness.
		skipped    []uint16
		rechecking bool
		freshSince = time.Now().Add(-liveTTL)
	)
	next := req.Next
	for !found && !exhausted {
		if err := ctx.Err(); err != nil {
			return store.Reservation{}, err
		}
		err := s.write(ctx, "scan", func(tctx context.Context) error {
			if err := s.fresh(tctx); err != nil {
				return storageErr("scan", err)
			}
			for checked := 0; checked < batch; {
				if err := ctx.Err(); err != nil {
					return err
				}
				port, ok := next()
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
					port, ok = next()
				}
				if !ok {
					exhausted = true
					return nil // commit the rows reaped on the way
				}
				key.Port = port
				rows, fromTable, err := s.holders(tctx, key)
				if err != nil {
					return storageErr("look up "+key.String(), err)
				}
				if s.heldLive(tctx, rows, freshSince) {
					if !rechecking {
						skipped = append(skipped, port)
					}
					continue
				}
				checked++
				if !fromTable {
					// The view called it free: check against the table
					// itself, so that a slip in keeping the view in step
					// can never become a double grant.
					if rows, err = s.conflictRows(tctx, key); err != nil {
						return err
					}
				}
				if err := s.clearDead(tctx, key, own, rows); err != nil {
					if !errors.Is(err, store.ErrHeld) {
						// Another candidate will do; this row waits for the sweep.
						s.log.Error(err, "could not reap a row in the way", "key", key.String())
					}
					continue
				}
				if err := s.probe(req.Probe, key); errors.Is(err, store.ErrHeld) {
					continue
				} else if err != nil {
					return err
				}
				res, err = s.insert(tctx, key, own, req.Label, kind, lease)
				if err != nil {
					return err
				}
				found = true
				return nil
			}
			return nil
		})
		if err != nil {
			return store.Reservation{}, err
		}
	}
	if !found {
		return store.Reservation{}, fmt.Errorf("scan for %s on %s: %w", req.Protocol, key.Addr, store.ErrExhausted)
	}
	return res, nil
}

// probe runs the caller's probe, if any, and counts a port it refuses.
// A refusal wraps store.ErrHeld; any other error stops the call.
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

// conflictRows reads the rows that conflict with key from the table.
func (s *sqlStore) conflictRows(ctx context.Context, key store.Key) ([]store.Reservation, error) {
	rows, err := s.st.conflicts.QueryContext(ctx, string(key.Protocol), int(key.Port))
	if err != nil {
		return nil, storageErr("look up "+key.String(), err)
	}
	defer func() { _ = rows.Close() }()
	var out []store.Reservation
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, storageErr("look up "+key.String(), err)
		}
		if netaddr.Conflicts(r.Addr, key.Addr) {
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, storageErr("look up "+key.String(), err)
	}
	return out, nil
}

// heldLive reports whether any of rows has a live owner, trusting what the
// store remembers of liveness since freshSince: it only decides which
// candidates to skip.
func (s *sqlStore) heldLive(ctx context.Context, rows []store.Reservation, freshSince time.Time) bool {
	for _, r := range rows {
		if s.rowAlive(ctx, r, freshSince) {
			return true
		}
	}
	return false
}

// clearDead deletes the rows in key's way whose owners have exited. When a
// live owner holds one, it deletes nothing and returns a *store.ConflictError.
func (s *sqlStore) clearDead(ctx context.Context, key store.Key, own store.Owner, rows []store.Reservation) error {
	now := time.Now()
	for _, r := range rows {
		if s.rowAlive(ctx, r, now) {
			return &store.ConflictError{Key: key, Holder: r, Self: r.Owner.Same(own)}
		}
	}
	for _, r := range rows {
		packed, _ := netaddr.Pack(r.Addr) // read from the table: already normal
		if _, err := s.st.deleteKey.ExecContext(ctx, string(r.Protocol), int(r.Port), packed); err != nil {
			return storageErr("reap "+r.String(), err)
		}
		s.cache.remove(r.Key)
		s.reaped.Add(1)
		s.log.V(1).Info("reaped reservation of exited owner", "key", r.String(), "owner", r.Owner.String())
	}
	return nil
}

// insert inserts a row for own, or, when lease is not nil, for the holder
// under that lease (own is then the lease's owner).
func (s *sqlStore) insert(ctx context.Context, key store.Key, own store.Owner, label string, kind store.Kind, lease *leaseGrant) (store.Reservation, error) {
	packed, _ := netaddr.Pack(key.Addr) // normalised by validate
	now := s.now()
	r := store.Reservation{Key: key, Owner: own, Label: label, Kind: kind, Created: time.Unix(0, now.UnixNano())}
	stored, until := own, int64(0)
	if lease != nil {
		stored, until = lease.stored(), lease.until
		r.Expires = lease.expires
	}
	if _, err := s.st.insert.ExecContext(ctx,
		string(key.Protocol), int(key.Port), packed,
		stored.PID, stored.Start, stored.Namespace, stored.Name,
		label, string(kind), now.UnixNano(), until,
	); err != nil {
		return store.Reservation{}, storageErr("insert "+key.String(), err)
	}
	s.cache.add(r)
	return r, nil
}

// relabel sets the label of r's row, which has none.
func (s *sqlStore) relabel(ctx context.Context, r *store.Reservation, label string) error {
	packed, _ := netaddr.Pack(r.Addr) // read from the table: already normal
	if _, err := s.conn.ExecContext(ctx, "UPDATE port_allocations SET label = ? WHERE protocol = ? AND port = ? AND address = ? AND label = ''",
		label, string(r.Protocol), int(r.Port), packed); err != nil {
		return storageErr("label "+r.String(), err)
	}
	r.Label = label
	s.cache.remove(r.Key)
	return nil
}
