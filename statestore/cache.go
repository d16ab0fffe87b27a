package statestore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
)

// heldCache mirrors the table in memory so that a scan skips held ports
// without a query each. It is exact inside a write transaction once fresh
// has run: PRAGMA data_version changes exactly when another connection has
// committed, and this connection's own writes are applied to it as they
// happen. It is only ever a hint: a candidate it calls free is checked
// against the table before it is granted.
type heldCache struct {
	valid   bool
	version int64
	rows    map[uint32][]Reservation // by cacheKey
}

func cacheKey(p Protocol, port uint16) uint32 {
	k := uint32(port)
	if p == UDP {
		k |= 1 << 16
	}
	return k
}

// fresh brings the cache up to date. It must run inside a write transaction.
func (s *Store) fresh(ctx context.Context) error {
	var v int64
	if err := s.st.dataVersion.QueryRowContext(ctx).Scan(&v); err != nil {
		return fmt.Errorf("read data version: %w", err)
	}
	c := &s.cache
	if c.valid && c.version == v {
		return nil
	}
	c.valid = false
	rows, err := s.st.all.QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("load reservations: %w", err)
	}
	defer func() { _ = rows.Close() }()
	m := make(map[uint32][]Reservation, max(len(c.rows), 64))
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return err
		}
		k := cacheKey(r.Protocol, r.Port)
		m[k] = append(m[k], r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load reservations: %w", err)
	}
	c.rows, c.version, c.valid = m, v, true
	return nil
}

// holders returns the cached rows that conflict with k.
func (c *heldCache) holders(k Key) []Reservation {
	rs := c.rows[cacheKey(k.Protocol, k.Port)]
	var out []Reservation
	for _, r := range rs {
		if netaddr.Conflicts(r.Addr, k.Addr) {
			out = append(out, r)
		}
	}
	return out
}

func (c *heldCache) add(r Reservation) {
	if !c.valid {
		return
	}
	k := cacheKey(r.Protocol, r.Port)
	c.rows[k] = append(c.rows[k], r)
}

func (c *heldCache) remove(key Key) {
	if !c.valid {
		return
	}
	k := cacheKey(key.Protocol, key.Port)
	rs := c.rows[k]
	for i, r := range rs {
		if r.Addr == key.Addr {
			rs = append(rs[:i:i], rs[i+1:]...)
			break
		}
	}
	if len(rs) == 0 {
		delete(c.rows, k)
	} else {
		c.rows[k] = rs
	}
}

// invalidate drops the cache after a write whose effect on it is not known
// row by row (bulk deletes, failed transactions).
func (c *heldCache) invalidate() { c.valid = false }

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
