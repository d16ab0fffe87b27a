package statestore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berth-go/berth/internal/marker"
	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/store"
)

// ownerArgs are the arguments of ownerMatch.
func ownerArgs(o Owner) []any { return []any{o.PID, o.Scope, o.Start} }

// Release deletes the reservation of key if own holds it; zero own: this
// process. It returns an error wrapping ErrNotFound when own holds no such
// reservation (another owner's row is never touched).
func (s *Store) Release(ctx context.Context, key Key, own Owner) error {
	key, own, err := s.validate(key, own)
	if err != nil {
		return err
	}
	packed, _ := netaddr.Pack(key.Addr)
	args := append([]any{string(key.Protocol), int(key.Port), packed}, ownerArgs(own)...)
	// The mark goes before the row: a mark that outlived its row (this
	// process stopped, or frozen, right after the delete) would give a
	// store made anew, after a loss, a row of a port released and perhaps
	// granted to another process since, whose own mark it would then
	// compete with. A store made between the two has no row of a port
	// being released, as it should.
	marked := s.dropMark(key, own)
	n, err := s.exec(ctx, "release "+key.String(), func(int64) { s.cache.remove(key) }, s.st.deleteOwned, args...)
	if testHookWritten != nil {
		testHookWritten()
	}
	if err != nil {
		// Still held, in the same file: marked again. Not when the file
		// was lost (also while the write waited in vain for the lock): a
		// store made anew since the mark went has no row of the port, as
		// it should, and a mark made again would give the next one a row
		// of a port being released. The error stays the write's own: a
		// release that waited in vain for the lock does not go on to
		// wait for the store to be made anew.
		if marked && !errors.Is(s.lostMeanwhile("release "+key.String(), err), ErrLost) {
			if _, merr := s.markFor(key, own); merr != nil {
				s.log.V(1).Info("could not mark again a reservation whose release failed", "key", key.String(), "error", merr.Error())
			}
		}
		return err
	}
	if n == 0 {
		return fmt.Errorf("release %s: %w for %s", key, ErrNotFound, own)
	}
	return nil
}

// lostMeanwhile returns err, a write's failure, or, when the store's file
// was lost while the write failed (it waited for a lock that a process
// making the store anew held, say), an error wrapping ErrLost that says
// both: what became of the marks, and what the caller does next, follow
// the loss.
func (s *Store) lostMeanwhile(op string, err error) error {
	if err == nil || errors.Is(err, ErrLost) || errors.Is(err, ErrClosed) {
		return err
	}
	if lerr := s.sameFileStat(); errors.Is(lerr, ErrLost) {
		return fmt.Errorf("%s: %w (the write failed with: %s)", op, lerr, err.Error())
	}
	return err
}

// testHookWritten, when set by a test, runs in Release and Transfer once
// the write has committed or failed, before the marks are settled.
var testHookWritten func()

// ReleaseOwner deletes every reservation own holds and returns how many
// there were; zero own: this process.
func (s *Store) ReleaseOwner(ctx context.Context, own Owner) (int, error) {
	if own.IsZero() {
		own = s.self
	} else if err := store.CheckOwner(own); err != nil {
		return 0, err
	}
	n, err := s.exec(ctx, "release all of "+own.String(), func(int64) { s.cache.stale() }, s.st.deleteOwner, ownerArgs(own)...)
	if err == nil {
		marker.Prune(s.ns, func(m marker.Mark) bool { return !markOwner(m).Same(own) })
	}
	return int(n), err
}

// Transfer hands the reservation of key from one owner to another, e.g.
// from an orchestrator to the child it started, so that the port stays
// reserved exactly as long as the child runs. to must be a live process.
func (s *Store) Transfer(ctx context.Context, key Key, from, to Owner) error {
	key, from, err := s.validate(key, from)
	if err != nil {
		return err
	}
	if err := store.CheckOwner(to); err != nil {
		return err
	}
	if !to.Alive(ctx) {
		return &FieldError{Field: "owner", Value: to.String(), Want: "a running process"}
	}
	// The new owner's mark comes first: a row handed over without one
	// would be lost with the file while its new owner lives. The old
	// owner's goes before the write, as in Release: a store made anew
	// after a loss while both stood would have to guess whose the row is.
	made, err := s.markFor(key, to)
	if err != nil {
		return err
	}
	mf, fromMarked := s.markOf(key, from)
	mt, toMarked := s.markOf(key, to)
	toMarked = toMarked && marker.Holds(s.ns, mt) // unless marking failed
	if fromMarked && mt == mf {
		fromMarked = false // a transfer to itself keeps its mark
	}
	if fromMarked {
		fromMarked = marker.Drop(s.ns, mf)
	}
	packed, _ := netaddr.Pack(key.Addr)
	args := append([]any{to.PID, to.Start, to.Scope, to.Name,
		string(key.Protocol), int(key.Port), packed}, ownerArgs(from)...)
	n, err := s.exec(ctx, "transfer "+key.String(), func(int64) { s.cache.stale() }, s.st.transfer, args...)
	if testHookWritten != nil {
		testHookWritten()
	}
	err = s.lostMeanwhile("transfer "+key.String(), err)
	if err == nil && n == 0 {
		err = fmt.Errorf("transfer %s: %w for %s", key, ErrNotFound, from)
	}
	switch {
	case err == nil:
	case errors.Is(err, ErrLost) && toMarked:
		// The file was lost: the new owner's mark stays, the only one
		// of the key. A store made anew since the old owner's went has
		// the row as the new owner's, and the caller hands it on there;
		// one made from now on has it too. Marking the old owner again
		// would leave two marks of the key, one of them stale.
	default:
		// Still the old owner's, in the same file: as before the call.
		if made {
			s.dropMark(key, to)
		}
		if fromMarked {
			if _, merr := s.markFor(key, from); merr != nil {
				s.log.V(1).Info("could not mark again a reservation whose transfer failed", "key", key.String(), "error", merr.Error())
			}
		}
	}
	return err
}

// List returns the reservations that match f, ordered by protocol, port and
// address. Rows of exited owners are included until they are reaped: use
// Owner.Alive to tell them apart.
func (s *Store) List(ctx context.Context, f Filter) ([]Reservation, error) {
	var (
		where []string
		args  []any
	)
	if f.Protocol != "" {
		if !f.Protocol.Valid() {
			return nil, &FieldError{Field: "protocol", Value: string(f.Protocol), Want: `"tcp" or "udp"`}
		}
		where, args = append(where, "protocol = ?"), append(args, string(f.Protocol))
	}
	if f.Port != 0 {
		where, args = append(where, "port = ?"), append(args, int(f.Port))
	}
	if f.Label != "" {
		where, args = append(where, "label = ?"), append(args, f.Label)
	}
	if f.OwnerPID != 0 {
		where, args = append(where, "owner_pid = ? AND lease_until = 0"), append(args, f.OwnerPID)
	}
	q := "SELECT " + rowColumns + " FROM port_allocations"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY protocol, port, address"

	release, err := s.acquire(ctx, false)
	if err != nil {
		return nil, acquireErr("list", err)
	}
	defer release()
	rows, err := s.conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, storageErr("list", err)
	}
	defer func() { _ = rows.Close() }()
	var out []Reservation
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, storageErr("list", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, storageErr("list", err)
	}
	return out, nil
}

// Reap deletes every reservation whose owner has exited and returns how
// many it deleted. Liveness is checked without holding the write lock (it
// reads the process table); a dead owner never comes back, so its rows can
// be deleted afterwards without a recheck.
//
// Reservations under a lease are deleted once their lease has ended (see
// ReserveLease); no process table is read for them.
func (s *Store) Reap(ctx context.Context) (int, error) {
	owners, leases, err := s.owners(ctx)
	if err != nil {
		return 0, err
	}
	dead := map[ownerKey]bool{}
	for _, o := range owners {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if !o.Alive(ctx) {
			dead[ownerKey{o.PID, o.Start, o.Scope}] = true
		}
	}
	if len(dead) == 0 && !leases {
		return 0, nil
	}
	var n int64
	err = s.write(ctx, "reap", func(tctx context.Context) error {
		// One pass over the table picks the rows; each is deleted by its key.
		doomed, err := s.rowsWhere(tctx, func(r Reservation) bool {
			if r.Owner.IsLease() {
				return !r.LeaseLive()
			}
			return dead[ownerKey{r.Owner.PID, r.Owner.Start, r.Owner.Scope}]
		})
		if err != nil {
			return storageErr("reap", err)
		}
		for _, r := range doomed {
			packed, _ := netaddr.Pack(r.Addr)
			if _, err := s.st.deleteKey.ExecContext(tctx, string(r.Protocol), int(r.Port), packed); err != nil {
				return storageErr("reap "+r.String(), err)
			}
			n++
		}
		s.cache.stale()
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.reaped.Add(n)
	if n > 0 {
		s.log.Info("reaped reservations of exited owners and ended leases", "rows", n, "owners", len(dead))
	}
	return int(n), nil
}

// rowsWhere reads the whole table and returns the rows keep selects. The
// rows are closed before it returns, so the caller can write on the same
// connection.
func (s *Store) rowsWhere(ctx context.Context, keep func(Reservation) bool) ([]Reservation, error) {
	rows, err := s.st.all.QueryContext(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []Reservation
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		if keep(r) {
			out = append(out, r)
		}
	}
	return out, rows.Err()
}

// owners returns the process owners of the table's rows, and whether it
// has rows under a lease.
func (s *Store) owners(ctx context.Context) ([]Owner, bool, error) {
	release, err := s.acquire(ctx, false)
	if err != nil {
		return nil, false, acquireErr("reap", err)
	}
	defer release()
	rows, err := s.conn.QueryContext(ctx, qOwners)
	if err != nil {
		return nil, false, storageErr("reap", err)
	}
	defer func() { _ = rows.Close() }()
	var out []Owner
	for rows.Next() {
		var o Owner
		if err := rows.Scan(&o.PID, &o.Start, &o.Scope); err != nil {
			return nil, false, storageErr("reap", err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, false, storageErr("reap", err)
	}
	var leases bool
	if err := s.conn.QueryRowContext(ctx, qLeases).Scan(&leases); err != nil {
		return nil, false, storageErr("reap", err)
	}
	return out, leases, nil
}

// firstSweep is how long after Open the first sweep runs at the latest. A
// process that lives less (`berth get`, a short test binary) never sweeps:
// its first port would otherwise wait for a pass over the whole table, and
// the rows in its way are reaped as it meets them anyway.
const firstSweep = time.Second

// sweep reaps after min(every, firstSweep) and then every interval until
// Close.
func (s *Store) sweep(every time.Duration) {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTimer(min(every, firstSweep))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		// Close ends a sweep in flight: ErrClosed or ctx's end is no failure.
		// A lost file (see ErrLost) is no failure of the sweep: the
		// store's owner learns of it at its next call, and opens the
		// store again; until then, every minute would log the same.
		switch _, err := s.Reap(ctx); {
		case err == nil || ctx.Err() != nil || errors.Is(err, ErrClosed):
		case errors.Is(err, ErrLost):
			s.log.V(1).Info("no reaping sweep: the store's file was lost", "error", err.Error(), "in", every.String())
		default:
			s.log.Error(err, "background reaping sweep failed; it runs again", "in", every.String())
		}
		s.pruneMarks(ctx)
		if err := s.pruneSticky(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, ErrClosed) {
			s.log.V(1).Info("forgetting old sticky ports failed; it runs again", "in", every.String(), "error", err.Error())
		}
		t.Reset(every)
	}
}

// Stats returns the store's counters. It is cheap and takes no lock.
func (s *Store) Stats() Stats {
	return Stats{Reaped: s.reaped.Load(), ProbeFailures: s.probeFailures.Load()}
}

// ReservedPorts returns the distinct ports from first to last that have at
// least one reservation, of any protocol, address or owner.
func (s *Store) ReservedPorts(ctx context.Context, first, last uint16) ([]uint16, error) {
	release, err := s.acquire(ctx, false)
	if err != nil {
		return nil, acquireErr("list ports", err)
	}
	defer release()
	rows, err := s.conn.QueryContext(ctx, "SELECT DISTINCT port FROM port_allocations WHERE protocol IN ('tcp', 'udp') AND port BETWEEN ? AND ? ORDER BY port", int(first), int(last))
	if err != nil {
		return nil, storageErr("list ports", err)
	}
	defer func() { _ = rows.Close() }()
	var out []uint16
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			return nil, storageErr("list ports", err)
		}
		out = append(out, uint16(p))
	}
	if err := rows.Err(); err != nil {
		return nil, storageErr("list ports", err)
	}
	return out, nil
}
