package statestore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/berth-go/berth/internal/netaddr"

	"github.com/berth-go/berth/store"
)

// heldCache is this connection's view of the table, by (protocol, port),
// filled as scans visit candidates, so that a scan skips held ports without
// a query each. An entry is exact while no other connection has committed
// since it was read: when PRAGMA data_version moves, fresh opens a new
// generation, and older entries are read again when next visited, so a
// call costs what it visits, not the table's size. The view is only a
// hint: a candidate it calls free is checked against the table.
type heldCache struct {
	valid   bool                 // version is known; false when new and after a failed transaction
	version int64                // data_version at which generation gen began
	gen     uint64               // entries of this generation are exact
	rows    map[uint32]viewEntry // by cacheKey; only keys that had rows
}

type viewEntry struct {
	gen  uint64
	rows []store.Reservation
}

func cacheKey(p store.Protocol, port uint16) uint32 {
	k := uint32(port)
	if p == store.UDP {
		k |= 1 << 16
	}
	return k
}

// fresh brings the view up to date, inside a write transaction.
func (s *sqlStore) fresh(ctx context.Context) error {
	var v int64
	if err := s.st.row(ctx, qDataVersion).Scan(&v); err != nil {
		s.cache.valid = false
		return fmt.Errorf("read data version: %w", err)
	}
	c := &s.cache
	if c.valid && c.version == v {
		return nil
	}
	if c.rows == nil {
		c.rows = make(map[uint32]viewEntry, 64)
	}
	c.gen++
	c.version, c.valid = v, true
	return nil
}

// entry returns k's rows when the view knows them exactly.
func (c *heldCache) entry(k uint32) ([]store.Reservation, bool) {
	e, ok := c.rows[k]
	if !ok || !c.valid || e.gen != c.gen {
		return nil, false
	}
	return e.rows, true
}

// holders returns the rows that conflict with k, from the view when it
// knows k's port, else from the table (fromTable), remembered.
func (s *sqlStore) holders(ctx context.Context, k store.Key) (out []store.Reservation, fromTable bool, err error) {
	ck := cacheKey(k.Protocol, k.Port)
	all, known := s.cache.entry(ck)
	if !known {
		if all, err = s.rowsOf(ctx, nil, qConflicts, string(k.Protocol), int(k.Port)); err != nil {
			return nil, false, err
		}
		switch {
		case !s.cache.valid:
		case len(all) > 0:
			s.cache.rows[ck] = viewEntry{gen: s.cache.gen, rows: all}
		default:
			delete(s.cache.rows, ck)
		}
	}
	for _, r := range all {
		if netaddr.Conflicts(r.Addr, k.Addr) {
			out = append(out, r)
		}
	}
	return out, !known, nil
}

func (c *heldCache) add(r store.Reservation) {
	k := cacheKey(r.Protocol, r.Port)
	if rs, known := c.entry(k); known {
		c.rows[k] = viewEntry{gen: c.gen, rows: append(rs, r)}
	}
}

func (c *heldCache) remove(key store.Key) {
	k := cacheKey(key.Protocol, key.Port)
	rs, known := c.entry(k)
	if !known {
		return
	}
	for i, r := range rs {
		if r.Addr == key.Addr {
			rs = append(rs[:i:i], rs[i+1:]...)
			break
		}
	}
	if len(rs) == 0 {
		delete(c.rows, k)
		return
	}
	c.rows[k] = viewEntry{gen: c.gen, rows: rs}
}

// stale forgets the view after a write of this connection not applied row
// by row (bulk deletes, transfers): data_version counts only other
// connections' commits.
func (c *heldCache) stale() { c.gen++ }

// scanRow reads one row in rowColumns order. A row that breaks the schema's
// rules (possible only in a hand-edited file) is an error, never a panic.
func scanRow(rows *sql.Rows) (store.Reservation, error) {
	var (
		r           store.Reservation
		proto, kind string
		port        int64
		addr        []byte
		created     int64
		until       int64
	)
	if err := rows.Scan(&proto, &port, &addr, &r.Owner.PID, &r.Owner.Start, &r.Owner.Namespace, &r.Owner.Name, &r.Label, &kind, &created, &until); err != nil {
		return store.Reservation{}, fmt.Errorf("read reservation: %w", err)
	}
	if until != 0 {
		leaseRow(&r, until)
	}
	a, err := netaddr.Unpack(addr)
	if err != nil {
		return store.Reservation{}, fmt.Errorf("read reservation: %w", err)
	}
	if port < 1 || port > 65535 {
		return store.Reservation{}, fmt.Errorf("read reservation: port %d out of range", port)
	}
	r.Protocol, r.Port, r.Addr, r.Kind = store.Protocol(proto), uint16(port), a, store.Kind(kind)
	r.Created = time.Unix(0, created)
	return r, nil
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

// rowAlive reports whether r's owner still holds it, with the store
// acquired. A remembered death is always used; a remembered life only when
// checked after freshSince: now where a wrong "alive" would refuse a request
// or keep a row, a moment ago where it only skips a candidate.
func (s *sqlStore) rowAlive(ctx context.Context, r store.Reservation, freshSince time.Time) bool {
	o := r.Owner
	if o.Holder != "" {
		return leaseLive(r)
	}
	if o.Same(s.self) {
		return true
	}
	k := ownerKey{o.PID, o.Start, o.Namespace}
	now := time.Now()
	if e, ok := s.live[k]; ok && (!e.alive || e.at.After(freshSince)) {
		return e.alive
	}
	a := o.Alive(ctx)
	if s.live == nil || len(s.live) >= liveCacheMax {
		s.live = make(map[ownerKey]liveEntry)
	}
	s.live[k] = liveEntry{alive: a, at: now}
	return a
}
