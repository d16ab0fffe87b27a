package statestore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/store"
)

// The statements of the hot paths, prepared once on the store's connection.
// BEGIN, COMMIT and ROLLBACK are prepared too: parsing them on every call
// costs as much as the insert.
const (
	qBegin       = "BEGIN IMMEDIATE"
	qCommit      = "COMMIT"
	qRollback    = "ROLLBACK"
	qDataVersion = "PRAGMA data_version"

	rowColumns = "protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind, created_at, lease_until"

	// qConflicts reads every row of one (protocol, port): a range scan of
	// the primary key, guarded by TestConflictQueryUsesPrimaryKey.
	qConflicts = "SELECT " + rowColumns + " FROM port_allocations WHERE protocol = ? AND port = ?"

	qInsert = "INSERT INTO port_allocations (" + rowColumns + ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

	qDeleteKey = "DELETE FROM port_allocations WHERE protocol = ? AND port = ? AND address = ?"
	qRelabel   = "UPDATE port_allocations SET label = ? WHERE protocol = ? AND port = ? AND address = ? AND label = ''"

	// Owners match exactly: the start is the kernel's record, which no
	// clock step moves (see store.Owner).
	ownerMatch = "owner_pid = ? AND owner_scope = ? AND owner_start = ?"

	qDeleteOwned = "DELETE FROM port_allocations WHERE protocol = ? AND port = ? AND address = ? AND " + ownerMatch

	// qDeleteHeld matches whatever the lease's scope.
	qDeleteHeld = "DELETE FROM port_allocations WHERE protocol = ? AND port = ? AND address = ? AND lease_until <> 0 AND owner_name = ?"

	// qDeleteOwner scans the table: see the migration on why the owner has
	// no index.
	qDeleteOwner = "DELETE FROM port_allocations WHERE " + ownerMatch

	qTransfer = "UPDATE port_allocations SET owner_pid = ?, owner_start = ?, owner_scope = ?, owner_name = ?" +
		" WHERE protocol = ? AND port = ? AND address = ? AND " + ownerMatch

	qAll = "SELECT " + rowColumns + " FROM port_allocations"

	// Rows under a lease are judged by their lease_until instead.
	qOwners = "SELECT DISTINCT owner_pid, owner_start, owner_scope FROM port_allocations WHERE lease_until = 0"
	qLeases = "SELECT EXISTS (SELECT 1 FROM port_allocations WHERE lease_until <> 0)"

	qRemember = "INSERT INTO sticky_ports (label, protocol, port, updated_at) VALUES (?, ?, ?, ?)" +
		" ON CONFLICT (label, protocol) DO UPDATE SET port = excluded.port, updated_at = excluded.updated_at"
	qRecall = "SELECT port FROM sticky_ports WHERE label = ? AND protocol = ?"
	// qPruneSticky keeps the ? most recently remembered sticky ports.
	qPruneSticky = "DELETE FROM sticky_ports WHERE (label, protocol) IN" +
		" (SELECT label, protocol FROM sticky_ports ORDER BY updated_at DESC LIMIT -1 OFFSET ?)"
)

// keyArgs are the arguments of a key's columns; the key is in normal form.
func keyArgs(k store.Key) []any {
	packed, _ := netaddr.Pack(k.Addr)
	return []any{string(k.Protocol), int(k.Port), packed}
}

// ownerArgs are the arguments of ownerMatch.
func ownerArgs(o store.Owner) []any { return []any{o.PID, o.Namespace, o.Start} }

// rowsOf runs q, a SELECT of rowColumns, and returns the rows keep accepts
// (nil: all), closed, so the caller can write on the connection.
func (s *sqlStore) rowsOf(ctx context.Context, keep func(store.Reservation) bool, q string, args ...any) ([]store.Reservation, error) {
	rows, err := s.st.query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []store.Reservation
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		if keep == nil || keep(r) {
			out = append(out, r)
		}
	}
	return out, rows.Err()
}

// statements prepares each statement the first time it is used and keeps it
// for the store's life: opening a store (every berth get does) parses none.
// Like the connection, they are used only with the store acquired.
type statements struct {
	conn     *sql.Conn
	prepared map[string]*sql.Stmt
}

func (st *statements) get(ctx context.Context, q string) (*sql.Stmt, error) {
	if p, ok := st.prepared[q]; ok {
		return p, nil
	}
	p, err := st.conn.PrepareContext(ctx, q) //nolint:sqlclosecheck // kept for the store's life; closed by close
	if err != nil {
		return nil, err
	}
	if st.prepared == nil {
		st.prepared = map[string]*sql.Stmt{}
	}
	st.prepared[q] = p
	return p, nil
}

func (st *statements) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	p, err := st.get(ctx, q) //nolint:sqlclosecheck // kept for the store's life; closed by close
	if err != nil {
		return nil, err
	}
	return p.ExecContext(ctx, args...)
}

func (st *statements) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	p, err := st.get(ctx, q) //nolint:sqlclosecheck // kept for the store's life; closed by close
	if err != nil {
		return nil, err
	}
	return p.QueryContext(ctx, args...)
}

// row runs q for one row; when q cannot be prepared, the row carries that
// error, from running it unprepared.
func (st *statements) row(ctx context.Context, q string, args ...any) *sql.Row {
	p, err := st.get(ctx, q) //nolint:sqlclosecheck // kept for the store's life; closed by close
	if err != nil {
		return st.conn.QueryRowContext(ctx, q, args...)
	}
	return p.QueryRowContext(ctx, args...)
}

func (st *statements) close() error {
	var errs []error
	for _, p := range st.prepared {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
