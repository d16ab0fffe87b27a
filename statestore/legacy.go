package statestore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/berth-go/berth/internal/owner"

	"github.com/berth-go/berth/store"
)

// Rows written by berth before schema version 3 name their owners in the
// earlier format: a start in unix milliseconds derived from the wall clock,
// which a clock step moves, and a scope without the format tag (see package
// internal/owner). They are judged conservatively wherever they are met;
// convertLegacyOwners rewrites them once, so that from then on every owner
// is compared exactly.

// qConvertOwner rewrites the identity of one owner in every row it holds.
// The name stays: it is for people, and the row's own is as good as any.
const qConvertOwner = "UPDATE port_allocations SET owner_start = ?, owner_scope = ? WHERE " + ownerMatch

// convertLegacyOwners rewrites the rows of owners in the earlier format, in
// one write transaction: rows of an owner that still runs get its current
// identity, rows of an owner that has exited (no such pid, a zombie, a pid
// reused since, another boot) are deleted and counted as reaped. Rows whose
// owner cannot be checked (another pid namespace, a process this one may not
// inspect) are kept as they are; they count as live until a process that
// can check them converts or reaps them.
func (s *sqlStore) convertLegacyOwners(ctx context.Context) (converted, deleted int, err error) {
	const op = "convert owners recorded by an earlier berth"
	err = s.write(ctx, op, func(tctx context.Context) error {
		converted, deleted = 0, 0
		legacy, err := s.legacyOwners(tctx)
		if err != nil {
			return storageErr(op, err)
		}
		for _, o := range legacy {
			if err := ctx.Err(); err != nil {
				return err
			}
			up, err := owner.Upgrade(tctx, owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Namespace})
			switch {
			case errors.Is(err, owner.ErrNotRunning):
				n, err := changed(s.st.deleteOwner.ExecContext(tctx, ownerArgs(o)...))
				if err != nil {
					return storageErr(op, err)
				}
				deleted += n
			case err != nil:
				s.log.V(1).Info("kept reservations of an owner that cannot be checked", "owner", o.String(), "reason", err.Error())
			default:
				args := append([]any{up.Start, up.Scope}, ownerArgs(o)...)
				n, err := changed(s.conn.ExecContext(tctx, qConvertOwner, args...))
				if err != nil {
					return storageErr(op, err)
				}
				converted += n
			}
		}
		s.cache.stale()
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	s.reaped.Add(int64(deleted))
	return converted, deleted, nil
}

// legacyOwners returns the distinct owners in the earlier format. Its rows
// are closed before it returns, so the caller can write on the connection.
func (s *sqlStore) legacyOwners(ctx context.Context) ([]store.Owner, error) {
	rows, err := s.conn.QueryContext(ctx, qOwners)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []store.Owner
	for rows.Next() {
		var o store.Owner
		if err := rows.Scan(&o.PID, &o.Start, &o.Namespace); err != nil {
			return nil, err
		}
		if owner.IsLegacy(owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Namespace}) {
			out = append(out, o)
		}
	}
	return out, rows.Err()
}

// changed returns how many rows a statement changed.
func changed(res sql.Result, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
