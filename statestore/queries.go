package statestore

import (
	"context"
	"database/sql"
	"errors"
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

	// Owners match exactly: the start is the kernel's record, which no
	// clock step moves (see store.Owner).
	ownerMatch = "owner_pid = ? AND owner_scope = ? AND owner_start = ?"

	qDeleteOwned = "DELETE FROM port_allocations WHERE protocol = ? AND port = ? AND address = ? AND " + ownerMatch

	// qDeleteHeld deletes a named holder's row of a key, whatever its
	// lease's scope.
	qDeleteHeld = "DELETE FROM port_allocations WHERE protocol = ? AND port = ? AND address = ? AND lease_until <> 0 AND owner_name = ?"

	// qDeleteOwner scans the table: see the migration on why the owner has
	// no index.
	qDeleteOwner = "DELETE FROM port_allocations WHERE " + ownerMatch

	qTransfer = "UPDATE port_allocations SET owner_pid = ?, owner_start = ?, owner_scope = ?, owner_name = ?" +
		" WHERE protocol = ? AND port = ? AND address = ? AND " + ownerMatch

	qAll = "SELECT " + rowColumns + " FROM port_allocations"

	// qOwners lists the process owners; rows under a lease are judged by
	// their lease_until instead, and qLeases tells whether there are any.
	qOwners = "SELECT DISTINCT owner_pid, owner_start, owner_scope FROM port_allocations WHERE lease_until = 0"
	qLeases = "SELECT EXISTS (SELECT 1 FROM port_allocations WHERE lease_until <> 0)"

	qRemember = "INSERT INTO sticky_ports (label, protocol, port, updated_at) VALUES (?, ?, ?, ?)" +
		" ON CONFLICT (label, protocol) DO UPDATE SET port = excluded.port, updated_at = excluded.updated_at"
	qRecall = "SELECT port FROM sticky_ports WHERE label = ? AND protocol = ?"
	// qPruneSticky keeps the ? most recently remembered sticky ports.
	qPruneSticky = "DELETE FROM sticky_ports WHERE (label, protocol) IN" +
		" (SELECT label, protocol FROM sticky_ports ORDER BY updated_at DESC LIMIT -1 OFFSET ?)"
)

// statements are the store's statements, each prepared on its connection
// the first time it is used and kept for the store's life: a call pays for
// parsing only the statements it needs, once, and opening a store (every
// berth get does) parses none of them.
type statements struct {
	begin, commit, rollback, dataVersion *stmt
	conflicts, insert, deleteKey         *stmt
	deleteOwned, deleteOwner, transfer   *stmt
	deleteHeld                           *stmt
	all, remember, recall, pruneSticky   *stmt
}

func (st *statements) prepare(conn *sql.Conn) {
	for _, p := range []struct {
		dst **stmt
		q   string
	}{
		{&st.begin, qBegin}, {&st.commit, qCommit}, {&st.rollback, qRollback},
		{&st.dataVersion, qDataVersion}, {&st.conflicts, qConflicts},
		{&st.insert, qInsert}, {&st.deleteKey, qDeleteKey},
		{&st.deleteOwned, qDeleteOwned}, {&st.deleteOwner, qDeleteOwner},
		{&st.transfer, qTransfer}, {&st.all, qAll},
		{&st.remember, qRemember}, {&st.recall, qRecall},
		{&st.pruneSticky, qPruneSticky}, {&st.deleteHeld, qDeleteHeld},
	} {
		*p.dst = &stmt{conn: conn, q: p.q}
	}
}

func (st *statements) close() error {
	var errs []error
	for _, s := range []*stmt{
		st.begin, st.commit, st.rollback, st.dataVersion, st.conflicts, st.insert,
		st.deleteKey, st.deleteOwned, st.deleteOwner, st.transfer, st.all,
		st.remember, st.recall, st.pruneSticky, st.deleteHeld,
	} {
		if s != nil && s.st != nil {
			errs = append(errs, s.st.Close())
		}
	}
	return errors.Join(errs...)
}

// stmt is one statement, prepared on first use. Like the connection it
// belongs to, it is used only with the store acquired.
type stmt struct {
	conn *sql.Conn
	q    string
	st   *sql.Stmt // nil until first used
}

func (s *stmt) get(ctx context.Context) (*sql.Stmt, error) {
	if s.st == nil {
		st, err := s.conn.PrepareContext(ctx, s.q) //nolint:sqlclosecheck // kept for the store's life; closed by statements.close
		if err != nil {
			return nil, err
		}
		s.st = st
	}
	return s.st, nil
}

// ExecContext runs the statement.
func (s *stmt) ExecContext(ctx context.Context, args ...any) (sql.Result, error) {
	st, err := s.get(ctx) //nolint:sqlclosecheck // kept for the store's life; closed by statements.close
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// QueryContext runs the statement and returns its rows.
func (s *stmt) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	st, err := s.get(ctx) //nolint:sqlclosecheck // kept for the store's life; closed by statements.close
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// QueryRowContext runs the statement for one row. When the statement
// cannot be prepared, the row carries that error, from running the query
// unprepared.
func (s *stmt) QueryRowContext(ctx context.Context, args ...any) *sql.Row {
	st, err := s.get(ctx) //nolint:sqlclosecheck // kept for the store's life; closed by statements.close
	if err != nil {
		return s.conn.QueryRowContext(ctx, s.q, args...)
	}
	return st.QueryRowContext(ctx, args...)
}
