package statestore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
)

// heldCache is this connection's view of the table, by (protocol, port),
// filled key by key as scans visit candidates, so that a scan skips held
// ports without a query each. A key it knows is exact inside a write
// transaction once fresh has run: PRAGMA data_version changes exactly when
// another connection has committed, and the journal port_changes, which
// triggers write in every transaction that changes a row, names the keys
// whose rows changed; fresh forgets those keys, and the next visit reads
// them again. Nothing ever reads the whole table, so what a call costs
// follows the changes since the last call, not the size of the table.
// This connection's own writes are applied as they happen. The view is
// only ever a hint: a candidate it calls free is checked against the table
// before it is granted.
type heldCache struct {
	valid   bool
	behind  bool  // own writes whose rows are not applied: catch up from seq
	version int64 // data_version when last brought up to date
	seq     int64 // the journal entry up to which the view is exact
	// rows holds the rows of every key the view knows, by cacheKey; a key
	// with no rows is present with a nil slice.
	rows map[uint32][]Reservation
}

// maxCatchUp is how many journal entries fresh applies key by key; beyond
// it, forgetting every key is cheaper.
const maxCatchUp = 4096

func cacheKey(p Protocol, port uint16) uint32 {
	k := uint32(port)
	if p == UDP {
		k |= 1 << 16
	}
	return k
}

// fresh brings the view up to date. It must run inside a write transaction.
func (s *Store) fresh(ctx context.Context) error {
	var v int64
	if err := s.st.dataVersion.QueryRowContext(ctx).Scan(&v); err != nil {
		return fmt.Errorf("read data version: %w", err)
	}
	c := &s.cache
	if c.valid && c.version == v && !c.behind {
		return nil
	}
	var first, last int64
	if err := s.st.journalSpan.QueryRowContext(ctx).Scan(&first, &last); err != nil {
		c.valid = false
		return fmt.Errorf("read change journal: %w", err)
	}
	switch {
	case c.valid && last == c.seq:
	case c.valid && last > c.seq && first <= c.seq+1 && last-c.seq <= maxCatchUp:
		if err := s.forgetChanged(ctx); err != nil {
			c.valid = false
			return err
		}
	default:
		// New, after a failed transaction, or too far behind: start empty.
		c.rows = make(map[uint32][]Reservation, max(len(c.rows), 64))
	}
	c.version, c.seq, c.valid, c.behind = v, last, true, false
	return nil
}

// forgetChanged drops the keys the journal names after the view's position.
func (s *Store) forgetChanged(ctx context.Context) error {
	rows, err := s.st.changes.QueryContext(ctx, s.cache.seq)
	if err != nil {
		return fmt.Errorf("read change journal: %w", err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var (
			proto string
			port  int64
		)
		if err := rows.Scan(&proto, &port); err != nil {
			return fmt.Errorf("read change journal: %w", err)
		}
		if port >= 1 && port <= 65535 && Protocol(proto).Valid() {
			delete(s.cache.rows, cacheKey(Protocol(proto), uint16(port)))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read change journal: %w", err)
	}
	return nil
}

// holders returns the rows that conflict with k, from the view when it
// knows k's port, else read from the table (inside the caller's
// transaction) and remembered; fromTable says which.
func (s *Store) holders(ctx context.Context, k Key) (out []Reservation, fromTable bool, err error) {
	ck := cacheKey(k.Protocol, k.Port)
	all, known := s.cache.rows[ck]
	if !known {
		if all, err = s.keyRows(ctx, k); err != nil {
			return nil, false, err
		}
		if s.cache.valid {
			s.cache.rows[ck] = all
		}
	}
	for _, r := range all {
		if netaddr.Conflicts(r.Addr, k.Addr) {
			out = append(out, r)
		}
	}
	return out, !known, nil
}

// keyRows reads every row of one protocol and port.
func (s *Store) keyRows(ctx context.Context, key Key) ([]Reservation, error) {
	rows, err := s.st.conflicts.QueryContext(ctx, string(key.Protocol), int(key.Port))
	if err != nil {
		return nil, fmt.Errorf("load reservations of %s %d: %w", key.Protocol, key.Port, err)
	}
	defer func() { _ = rows.Close() }()
	var out []Reservation
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load reservations of %s %d: %w", key.Protocol, key.Port, err)
	}
	return out, nil
}

func (c *heldCache) add(r Reservation) {
	if !c.valid {
		return
	}
	k := cacheKey(r.Protocol, r.Port)
	if rs, known := c.rows[k]; known {
		c.rows[k] = append(rs, r)
	}
}

func (c *heldCache) remove(key Key) {
	if !c.valid {
		return
	}
	k := cacheKey(key.Protocol, key.Port)
	rs, known := c.rows[k]
	if !known {
		return
	}
	for i, r := range rs {
		if r.Addr == key.Addr {
			rs = append(rs[:i:i], rs[i+1:]...)
			break
		}
	}
	c.rows[k] = rs
}

// invalidate drops the view after a failed transaction, whose effects on
// it were applied and then rolled back.
func (c *heldCache) invalidate() { c.valid = false }

// stale marks the view behind a committed write of this connection whose
// effect on it is not known row by row (bulk deletes, transfers): the next
// fresh reads the journal even though data_version, which counts only
// other connections' commits, has not moved.
func (c *heldCache) stale() { c.behind = true }

// scanRow reads one row in rowColumns order. A row that breaks the schema's
// rules (possible only in a hand-edited file) is an error, never a panic.
func scanRow(rows *sql.Rows) (Reservation, error) {
	var (
		r           Reservation
		proto, kind string
		port        int64
		addr        []byte
		created     int64
	)
	if err := rows.Scan(&proto, &port, &addr, &r.Owner.PID, &r.Owner.Start, &r.Owner.Scope, &r.Owner.Name, &r.Label, &kind, &created); err != nil {
		return Reservation{}, fmt.Errorf("read reservation: %w", err)
	}
	a, err := netaddr.Unpack(addr)
	if err != nil {
		return Reservation{}, fmt.Errorf("read reservation: %w", err)
	}
	if port < 1 || port > 65535 {
		return Reservation{}, fmt.Errorf("read reservation: port %d out of range", port)
	}
	r.Protocol, r.Port, r.Addr, r.Kind = Protocol(proto), uint16(port), a, Kind(kind)
	r.Created = time.Unix(0, created)
	return r, nil
}

// liveness remembers owner liveness between calls. A dead owner stays dead
// (its identity includes its start time), so that answer is kept for good;
// a live one is asked again after liveTTL.
type liveness struct {
	m map[ownerKey]liveEntry
}

type ownerKey struct {
	pid   int
	start int64
	scope string
}

type liveEntry struct {
	alive bool
	at    time.Time
}

const (
	liveTTL      = time.Second
	liveCacheMax = 4096
)

// alive reports whether o still runs. A remembered death is always used;
// a remembered life only when it was checked after freshSince, which
// callers set to now (always check) where a wrong "alive" would refuse a
// request or keep a row, and to a moment ago where it only skips a
// candidate. It must be called with the store acquired.
func (s *Store) alive(ctx context.Context, o Owner, freshSince time.Time) bool {
	if o.Same(s.self) {
		return true
	}
	k := ownerKey{o.PID, o.Start, o.Scope}
	now := time.Now()
	if e, ok := s.live.m[k]; ok && (!e.alive || e.at.After(freshSince)) {
		return e.alive
	}
	a := o.Alive(ctx)
	if s.live.m == nil || len(s.live.m) >= liveCacheMax {
		s.live.m = make(map[ownerKey]liveEntry)
	}
	s.live.m[k] = liveEntry{alive: a, at: now}
	return a
}
