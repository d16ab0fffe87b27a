package statestore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/berth-go/berth/internal/owner"
)

// qConvertOwner keeps the name: it is for people, and the row's own is as good as any.
const qConvertOwner = "UPDATE port_allocations SET owner_start = ?, owner_scope = ? WHERE " + ownerMatch

// convertLegacyOwners rewrites, in one transaction, the rows berth before
// schema 3 wrote, whose owners have wall-clock starts (see owner.IsLegacy):
// an owner that still runs gets its current identity; rows of one that has
// exited are reaped; rows of one that cannot be checked (another pid
// namespace, say) stay until a process that can check them.
func (s *sqlStore) convertLegacyOwners(ctx context.Context) (converted, deleted int, err error) {
	const op = "convert owners recorded by an earlier berth"
	err = s.write(ctx, op, func(tctx context.Context) error {
		converted, deleted = 0, 0
		owners, err := s.processOwners(tctx)
		if err != nil {
			return storageErr(op, err)
		}
		for _, o := range owners {
			if err := ctx.Err(); err != nil {
				return err
			}
			if !owner.IsLegacy(owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Namespace}) {
				continue
			}
			up, err := owner.Upgrade(tctx, owner.Identity{PID: o.PID, Start: o.Start, Scope: o.Namespace})
			switch {
			case errors.Is(err, owner.ErrNotRunning):
				n, err := changed(s.st.exec(tctx, qDeleteOwner, ownerArgs(o)...))
				if err != nil {
					return storageErr(op, err)
				}
				deleted += n
			case err != nil:
				s.log.V(1).Info("kept reservations of an owner that cannot be checked", "owner", o.String(), "reason", err.Error())
			default:
				args := append([]any{up.Start, up.Scope}, ownerArgs(o)...)
				n, err := changed(s.st.exec(tctx, qConvertOwner, args...))
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

func changed(res sql.Result, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
