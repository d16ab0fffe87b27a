package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berth-go/berth/store"
)

// maxAttempts bounds how often one call tries a key again.
const maxAttempts = 16

// row is a reservation row with the host it is on.
type row struct {
	hostNo int32
	store.Reservation
}

// Reserve reserves req.Key on this host for req.Owner (zero: this
// process).
//
// A free key takes one round trip. When a row is in the way and req.Owner
// holds exactly req.Key already, its row is returned and no probe runs;
// rows of this host's exited owners are deleted (and counted as reaped)
// and the insert is tried again; any other holder is a
// *store.ConflictError naming it. The probe, when given, runs after the
// row is in, and a failed probe deletes the row again.
//
// In the grace period after a change of server (see the package doc) only
// a holder that puts back what it held (req.Restore) is granted a key it
// does not hold already; any other request waits, within ctx, for the
// period to end, or fails at once (store.ErrGrace) while this Store's own
// holders have yet to put their reservations back.
func (s *Store) Reserve(ctx context.Context, req store.Request) (store.Reservation, error) {
	req, err := req.Validate(s.self)
	if err != nil {
		return store.Reservation{}, err
	}
	if err := noHolder(req.Owner); err != nil {
		return store.Reservation{}, err
	}
	key, own, kind := req.Key, req.Owner, req.Kind
	op := "reserve " + key.String()
	memo := map[ownerKey]bool{}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		created, ok, wait, err := s.insertOne(ctx, op, key, own, req.Label, kind, req.Restore)
		if err != nil {
			return store.Reservation{}, err
		}
		if ok {
			if err := s.probeOrUndo(ctx, op, req.Probe, key, own, key.Port, false); err != nil {
				return store.Reservation{}, err
			}
			r := store.Reservation{Key: key, Owner: own, Label: req.Label, Kind: kind, Created: created}
			s.book.hold(r)
			if req.Restore {
				s.reassertNow(ctx)
			}
			return r, nil
		}
		rows, err := s.holders(ctx, op, key, []int32{int32(key.Port)})
		if err != nil {
			return store.Reservation{}, err
		}
		for _, r := range rows {
			if r.hostNo == s.hostNo() && r.Key == key && r.Owner.Same(own) {
				if wait != 0 && !req.Restore && s.owes() {
					// The row may be one released before the change that
					// the change brought back: the holders compare first.
					return store.Reservation{}, fmt.Errorf("%s: %w", op, &graceError{Left: time.Duration(max(wait, 0)) * time.Millisecond, Own: true})
				}
				s.book.hold(r.Reservation)
				return r.Reservation, nil
			}
		}
		// No rows: the holder left between the two statements.
		if err := s.clearDead(ctx, op, key, own, rows, memo); err != nil {
			var ce *store.ConflictError
			if req.Restore && wait != 0 && errors.As(err, &ce) && !ce.Self {
				// A row the change brought back, released before it,
				// holds the port; its holder releases it again.
				return store.Reservation{}, fmt.Errorf("%s: %w", op, &graceError{Left: time.Duration(max(wait, 0)) * time.Millisecond, Blocked: err})
			}
			return store.Reservation{}, err
		}
		if wait != 0 && !req.Restore {
			// Nobody holds the key: the grace period does.
			if err := s.waitGrace(ctx, op, wait); err != nil {
				return store.Reservation{}, err
			}
			attempt-- // the grace period is over: not an attempt
		}
	}
	return store.Reservation{}, fmt.Errorf("%s: %w: the port changed hands %d times while this call tried; try again", op, store.ErrBusy, maxAttempts)
}

// Scan reserves on this host the first of req's candidates that no row
// holds and that passes the probe, or returns an error wrapping
// store.ErrExhausted when Next runs out first.
//
// Candidates go to the server req.Batch at a time (zero: 32): one round
// trip grants the first of a batch that no row conflicts with, or returns
// their holders; rows of this host's exited owners are then deleted and
// their ports tried again. So a candidate that only a dead owner's row
// holds may be passed over for a later free one in the same batch.
func (s *Store) Scan(ctx context.Context, req store.ScanRequest) (store.Reservation, error) {
	key, own, kind, batch, err := s.checkScan(req)
	if err != nil {
		return store.Reservation{}, err
	}
	op := fmt.Sprintf("scan for %s on %s", key.Protocol, key.Addr)
	var (
		pending   []int32
		tries     = map[int32]int{}
		exhausted bool
		memo      = map[ownerKey]bool{}
	)
	for {
		if err := ctx.Err(); err != nil {
			return store.Reservation{}, err
		}
		for !exhausted && len(pending) < batch {
			p, ok := req.Next()
			if !ok {
				exhausted = true
				break
			}
			if p != 0 {
				pending = append(pending, int32(p))
			}
		}
		if len(pending) == 0 {
			return store.Reservation{}, fmt.Errorf("%s: %w", op, store.ErrExhausted)
		}
		got, held, wait, err := s.scanOnce(ctx, op, key, own, req.Label, kind, pending)
		if err != nil {
			return store.Reservation{}, err
		}
		if wait != 0 {
			// A grace period: the same candidates once it is over.
			if err := s.waitGrace(ctx, op, wait); err != nil {
				return store.Reservation{}, err
			}
			continue
		}
		if got != nil {
			key.Port = got.Port
			err := s.probeOrUndo(ctx, op, req.Probe, key, own, key.Port, false)
			var ce *store.ConflictError
			switch {
			case err == nil:
				s.book.hold(got.Reservation)
				return got.Reservation, nil
			case errors.As(err, &ce) && ce.Holder.Owner.IsZero():
				pending = slices.DeleteFunc(pending, func(p int32) bool { return p == int32(got.Port) }) // bound outside berth
				continue
			default:
				return store.Reservation{}, err
			}
		}
		byPort := map[int32][]row{}
		for _, r := range held {
			byPort[int32(r.Port)] = append(byPort[int32(r.Port)], r)
		}
		next := pending[:0]
		for _, p := range pending {
			tries[p]++
			if tries[p] > maxAttempts {
				continue // it keeps changing hands: leave it
			}
			rows := byPort[p]
			if len(rows) == 0 {
				next = append(next, p) // a race lost or a row just released: again
				continue
			}
			k := key
			k.Port = uint16(p)
			err := s.clearDead(ctx, op, k, own, rows, memo)
			switch {
			case err == nil:
				next = append(next, p) // its dead rows are gone: again
			case errors.Is(err, store.ErrHeld):
			case ctx.Err() != nil:
				return store.Reservation{}, err
			default:
				// Another candidate will do; the row waits for the sweep.
				s.log.Error(err, "could not reap a row in the way", "key", k.String())
			}
		}
		pending = next
	}
}

// scanOnce runs qScan: the row granted, or none and the candidates' holders, or the gate's wait.
func (s *Store) scanOnce(ctx context.Context, op string, key store.Key, own store.Owner, label string, kind store.Kind, candidates []int32) (*row, []row, int64, error) {
	if err := s.grantable(); err != nil {
		return nil, nil, 0, fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	rows, err := s.pool.Query(cctx, qScan, s.hostNo(), string(key.Protocol), key.Addr.String(), string(kind),
		candidates, own.PID, own.Start, own.Namespace, own.Name, label)
	if err != nil {
		return nil, nil, 0, s.fail(ctx, op, err)
	}
	defer rows.Close()
	var (
		got  *row
		held []row
		wait int64
	)
	for rows.Next() {
		var (
			granted bool
			gated   int64
		)
		r, err := scanRow(rows, &granted, &gated)
		if err != nil {
			return nil, nil, 0, s.fail(ctx, op, err)
		}
		switch {
		case gated != 0:
			wait = gated
		case granted:
			got = &r
		default:
			held = append(held, r)
		}
	}
	if err := rows.Err(); err != nil {
		if isExclusion(err) {
			return nil, nil, 0, nil // a race lost to a concurrent insert: again
		}
		return nil, nil, 0, s.fail(ctx, op, err)
	}
	return got, held, wait, nil
}

// ScanBlock reserves on this host n consecutive ports, base to base+n-1,
// for the first candidate base whose ports no live reservation holds and
// whose every port passes the probe: all of them or none (a base whose
// block would pass 65535 is skipped). It returns the reservations in port
// order, or an error wrapping store.ErrExhausted when the candidates run
// out.
//
// The n rows go in with one statement, which the exclusion constraint
// fails as a whole when any of them conflicts; then rows of this host's
// exited owners are deleted and the block tried again. The probe runs
// after the rows are in, and a failure deletes the whole block.
func (s *Store) ScanBlock(ctx context.Context, req store.ScanRequest, n int) ([]store.Reservation, error) {
	if n < 1 || n > store.MaxBlock {
		return nil, &store.FieldError{Field: "n", Value: fmt.Sprint(n), Want: fmt.Sprintf("a block of 1 to %d ports", store.MaxBlock)}
	}
	key, own, kind, _, err := s.checkScan(req)
	if err != nil {
		return nil, err
	}
	op := fmt.Sprintf("scan for a block of %d %s ports on %s", n, key.Protocol, key.Addr)
	memo := map[ownerKey]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		base, ok := req.Next()
		if !ok {
			return nil, fmt.Errorf("%s: %w", op, store.ErrExhausted)
		}
		if base == 0 || int(base)+n-1 > 65535 {
			continue
		}
		last := base + uint16(n-1)
		k := key
		k.Port = base
		ports := make([]int32, n)
		for i := range ports {
			ports[i] = int32(base) + int32(i)
		}
	attempts:
		for attempt := 0; attempt < maxAttempts; attempt++ {
			rs, wait, err := s.insertBlock(ctx, op, key, own, req.Label, kind, base, last)
			if err != nil {
				return nil, err
			}
			if wait != 0 {
				// A grace period: the same base once it is over.
				if err := s.waitGrace(ctx, op, wait); err != nil {
					return nil, err
				}
				attempt--
				continue
			}
			if rs != nil {
				if err := s.probeOrUndo(ctx, op, req.Probe, k, own, last, true); err != nil {
					if errors.Is(err, store.ErrHeld) {
						break attempts // bound outside berth: the next base
					}
					return nil, err
				}
				for _, r := range rs {
					s.book.hold(r)
				}
				return rs, nil
			}
			rows, err := s.holders(ctx, op, key, ports)
			if err != nil {
				return nil, err
			}
			if err := s.clearDead(ctx, op, k, own, rows, memo); err != nil {
				if errors.Is(err, store.ErrHeld) {
					break attempts
				}
				if ctx.Err() != nil {
					return nil, err
				}
				s.log.Error(err, "could not reap a row in the way", "key", k.String())
				break attempts
			}
		}
	}
}

// insertBlock inserts base..last: the rows, or nil when refused, or the gate's wait.
func (s *Store) insertBlock(ctx context.Context, op string, key store.Key, own store.Owner, label string, kind store.Kind, base, last uint16) ([]store.Reservation, int64, error) {
	rows, err := s.queryRows(ctx, s.grantable, op, qBlock, s.hostNo(), string(key.Protocol), key.Addr.String(), string(kind),
		int32(base), int32(last), own.PID, own.Start, own.Namespace, own.Name, label)
	switch {
	case isExclusion(err):
		return nil, 0, nil
	case err != nil:
		return nil, 0, err
	case len(rows) == 0:
		// The statement inserts all of the block or fails: no row is the
		// gate's doing.
		wait, err := s.gateWait(ctx, op)
		return nil, wait, err
	}
	var out []store.Reservation
	for _, r := range rows {
		out = append(out, r.Reservation)
	}
	return out, 0, nil
}

// probeOrUndo runs probe, when not nil, on every port of key.Port to last,
// just inserted for own (block: as a block), and deletes them all again
// when one fails, errs or panics (the panic goes on). A port bound outside
// berth is a *store.ConflictError whose holder is the zero Reservation.
func (s *Store) probeOrUndo(ctx context.Context, op string, probe func(store.Key) error, key store.Key, own store.Owner, last uint16, block bool) (err error) {
	if probe == nil {
		return nil
	}
	base := key.Port
	undo := func() {
		what, where := "row", []any{"key", key.String()}
		if block {
			what, where = "block", []any{"first", base, "last", last}
		}
		if _, derr := s.exec(context.WithoutCancel(ctx), op+": delete the "+what+" after its probe", qDeleteBlock,
			s.hostNo(), string(key.Protocol), int32(base), int32(last), own.PID, own.Start, own.Namespace, key.Addr.String()); derr != nil {
			s.log.Error(derr, "could not delete a "+what+" whose probe failed; its owner holds it until released", where...)
			err = errors.Join(err, derr)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			undo()
			panic(p)
		}
	}()
	for port := int(base); port <= int(last); port++ {
		k := key
		k.Port = uint16(port)
		if perr := probe(k); perr != nil {
			err = fmt.Errorf("probe %s: %w", k, perr)
			if errors.Is(perr, store.ErrHeld) {
				s.probeFailures.Add(1)
				s.log.V(1).Info("port held outside this store", "key", k.String(), "why", perr.Error())
				err = perr
			}
			undo()
			return err
		}
	}
	return nil
}

// insertOne runs qInsert: the row's creation time and true, or false when
// a row is in the way or (with the gate's wait) a grace period holds
// grants, which restore passes.
func (s *Store) insertOne(ctx context.Context, op string, key store.Key, own store.Owner, label string, kind store.Kind, restore bool) (time.Time, bool, int64, error) {
	if err := s.grantable(); err != nil {
		return time.Time{}, false, 0, fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	var (
		created *time.Time
		wait    int64
	)
	err := s.pool.QueryRow(cctx, qInsert, append(s.keyArgs(key, own), own.Name, label, string(kind), restore)...).Scan(&created, &wait)
	switch {
	case err == nil && created != nil:
		return *created, true, 0, nil
	case err == nil:
		return time.Time{}, false, wait, nil
	case isExclusion(err):
		return time.Time{}, false, 0, nil
	default:
		return time.Time{}, false, 0, s.fail(ctx, op, err)
	}
}

// keyArgs are the arguments $1 to $7 of keyMatch and ownerMatch.
func (s *Store) keyArgs(key store.Key, own store.Owner) []any {
	return []any{s.hostNo(), string(key.Protocol), int32(key.Port), key.Addr.String(), own.PID, own.Start, own.Namespace}
}

// holders reads the rows that conflict with key's address on any of ports (qHolders).
func (s *Store) holders(ctx context.Context, op string, key store.Key, ports []int32) ([]row, error) {
	return s.queryRows(ctx, s.open, op, qHolders, s.hostNo(), string(key.Protocol), ports, key.Addr.String())
}

// queryRows runs q, which returns rows of rowColumns: see query.
func (s *Store) queryRows(ctx context.Context, check func() error, op, q string, args ...any) ([]row, error) {
	return query(ctx, s, check, op, func(r pgx.CollectableRow) (row, error) { return scanRow(r, nil, nil) }, q, args...)
}

// query runs q once check passes and reads its rows with scan. An exclusion violation
// (a race lost) is returned as it is, any other error as fail makes it.
func query[T any](ctx context.Context, s *Store, check func() error, op string, scan pgx.RowToFunc[T], q string, args ...any) ([]T, error) {
	if err := check(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	rows, err := s.pool.Query(cctx, q, args...)
	if err != nil {
		return nil, s.fail(ctx, op, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil && !isExclusion(err) {
		return nil, s.fail(ctx, op, err)
	}
	return out, err
}

// queryRow runs q, one row, in one round trip once the store is open.
func (s *Store) queryRow(ctx context.Context, op, q string, args []any, dst ...any) error {
	if err := s.open(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	if err := s.pool.QueryRow(cctx, q, args...).Scan(dst...); err != nil {
		return s.fail(ctx, op, err)
	}
	return nil
}

type ownerKey struct {
	pid   int
	start int64
	scope string
}

// alive judges a holder: another host's row or a lease row is taken for live (not judged
// from here); one of this host's processes as the SQLite store judges it. memo keeps verdicts.
func (s *Store) alive(ctx context.Context, r row, memo map[ownerKey]bool) bool {
	if r.hostNo != s.hostNo() || r.Owner.Holder != "" {
		return true
	}
	k := ownerKey{r.Owner.PID, r.Owner.Start, r.Owner.Namespace}
	if v, ok := memo[k]; ok {
		return v
	}
	v := r.Owner.Alive(ctx)
	memo[k] = v
	return v
}

// clearDead deletes the rows in key's way whose owners have exited, or,
// when a live owner holds one, returns a *store.ConflictError naming it.
func (s *Store) clearDead(ctx context.Context, op string, key store.Key, own store.Owner, rows []row, memo map[ownerKey]bool) error {
	for _, r := range rows {
		if s.alive(ctx, r, memo) {
			return &store.ConflictError{Key: key, Holder: r.Reservation, Self: r.hostNo == s.hostNo() && r.Owner.Same(own)}
		}
	}
	for _, r := range rows {
		n, err := s.exec(ctx, "reap "+r.String(), qDeleteOwned, s.keyArgs(r.Key, r.Owner)...)
		if err != nil {
			return err
		}
		if n > 0 {
			s.reaped.Add(n)
			s.log.V(1).Info("reaped reservation of exited owner", "key", r.String(), "owner", r.Owner.String())
		}
	}
	return nil
}

// scanRow reads a row of rowColumns, after granted and the gate's wait
// when granted is not nil.
func scanRow(rows pgx.Row, granted *bool, wait *int64) (row, error) {
	var (
		r           row
		proto, addr string
		port        int32
		kind        string
	)
	dst := []any{&r.hostNo, &proto, &port, &addr, &r.Owner.PID, &r.Owner.Start, &r.Owner.Namespace, &r.Owner.Name, &r.Label, &kind, &r.Created}
	if granted != nil {
		dst = append([]any{granted, wait}, dst...)
	}
	if err := rows.Scan(dst...); err != nil {
		return row{}, err
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return row{}, fmt.Errorf("row of port %d has address %q: %w", port, addr, err)
	}
	r.Key = store.Key{Protocol: store.Protocol(proto), Addr: a.Unmap(), Port: uint16(port)}
	r.Kind = store.Kind(kind)
	if r.Owner.Namespace == leaseKind {
		r.Owner = store.Owner{Holder: r.Owner.Name}
	}
	return r, nil
}

func isExclusion(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ExclusionViolation
}

// checkScan validates a scan's request and returns its key (port 1: the scan sets it),
// owner, kind and batch size. A named holder is refused.
func (s *Store) checkScan(req store.ScanRequest) (store.Key, store.Owner, store.Kind, int, error) {
	req, err := req.Validate(s.self)
	if err == nil {
		err = noHolder(req.Owner)
	}
	return store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: 1}, req.Owner, req.Kind, req.Batch, err
}

// validate normalises key and own (zero: this process) for Release and
// Transfer.
func (s *Store) validate(key store.Key, own store.Owner) (store.Key, store.Owner, error) {
	if err := noHolder(own); err != nil {
		return store.Key{}, store.Owner{}, err
	}
	key, err := key.Normalize()
	if err != nil {
		return store.Key{}, store.Owner{}, err
	}
	if own.IsZero() {
		own = s.self
	}
	return key, own, own.Validate()
}

func noHolder(o store.Owner) error {
	if o.Holder != "" {
		return &store.FieldError{Field: "owner", Value: o.String(), Want: "a process of this host: a fleet's named holders reserve fleet-wide (pgstore.Store.ReserveFleet, berth fleet reserve), and NarrowFleet gives such a port a host"}
	}
	return nil
}
