package statestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
)

// HeldSet is a snapshot of the reservations in a state store file, as
// ReadHeld read them. The zero HeldSet holds nothing. It is immutable and
// safe for concurrent use.
type HeldSet struct {
	rows map[uint32][]Reservation // by cacheKey
	n    int
}

// maxPeekBusy bounds how long ReadHeld lets SQLite wait for a lock: a
// reader of a WAL database waits only while a connection recovers the WAL.
const maxPeekBusy = time.Second

// ReadHeld reads every reservation in the database at path through a
// read-only connection of its own. It takes neither berth's write lock nor
// its migration lock, writes nothing, and does not check the schema version:
// it serves a caller that cannot use the store (the file's schema is newer,
// its directory read-only, another program holds its write lock), so that
// such a caller can still keep clear of the ports the store holds. Readers of
// a WAL database need no lock that a writer holds.
//
// A path whose store TakeOver moved is read at the store's new place. A path
// with no file holds nothing: ReadHeld returns an empty set and no error.
// Rows of exited owners are included, since a reader cannot reap them; use
// Owner.Alive where that matters. An error that comes of a passing shortage
// of descriptors, memory or disk space wraps ErrTransient.
func ReadHeld(ctx context.Context, path string) (HeldSet, error) {
	path, err := filepath.Abs(path) // the file: URI takes an absolute path
	if err != nil {
		return HeldSet{}, readErr(path, err)
	}
	if m, moved, err := ReadMoved(path); err == nil && moved {
		// TakeOver moved the store: a process still pointed at the old
		// place keeps clear of the ports the store holds in the new one.
		path = m.To
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return HeldSet{}, nil
	case err != nil:
		return HeldSet{}, readErr(path, err)
	case !fi.Mode().IsRegular():
		return HeldSet{}, fmt.Errorf("read %s: not a regular file: %w", path, ErrDamaged)
	}
	busy := maxPeekBusy
	if dl, ok := ctx.Deadline(); ok {
		busy = max(min(busy, time.Until(dl)), time.Millisecond)
	}
	db, err := openDB(dsnBare(path) + fmt.Sprintf("?mode=ro&_pragma=busy_timeout(%d)", busy.Milliseconds()))
	if err != nil {
		return HeldSet{}, readErr(path, err)
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(1)
	rows, err := db.QueryContext(ctx, "SELECT "+rowColumns+" FROM port_allocations")
	if err != nil && strings.Contains(err.Error(), "no such column: lease_until") {
		// A store from before leases, which this process could not
		// migrate.
		rows, err = db.QueryContext(ctx, "SELECT "+rowColumnsV5+" FROM port_allocations")
	}
	if err != nil {
		return HeldSet{}, readErr(path, err)
	}
	defer func() { _ = rows.Close() }()
	h := HeldSet{rows: map[uint32][]Reservation{}}
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return HeldSet{}, readErr(path, err)
		}
		k := cacheKey(r.Protocol, r.Port)
		h.rows[k] = append(h.rows[k], r)
		h.n++
	}
	if err := rows.Err(); err != nil {
		return HeldSet{}, readErr(path, err)
	}
	return h, nil
}

// Len returns how many reservations the set holds.
func (h HeldSet) Len() int { return h.n }

// Holders returns the reservations of the set that conflict with k under
// the conflict rule of package store: same protocol and port, and equal
// addresses or either one a wildcard. k's address is normalised first; an
// address that cannot be normalised conflicts with nothing.
func (h HeldSet) Holders(k Key) []Reservation {
	if h.n == 0 {
		return nil
	}
	addr, err := netaddr.Normalize(k.Addr)
	if err != nil {
		return nil
	}
	var out []Reservation
	for _, r := range h.rows[cacheKey(k.Protocol, k.Port)] {
		if r.Protocol == k.Protocol && netaddr.Conflicts(r.Addr, addr) {
			out = append(out, r)
		}
	}
	return out
}

// readErr is an error of ReadHeld: one that comes of a passing shortage of
// descriptors, memory or disk space wraps ErrTransient and says so.
func readErr(path string, err error) error {
	if short := shortage(err, filepath.Dir(path)); short != nil {
		err = short
	}
	return fmt.Errorf("read %s: %w", path, err)
}
