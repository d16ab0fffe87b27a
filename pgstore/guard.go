package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berth-go/berth/store"
)

// The exclusion constraint is the fleet's guarantee, but its index uses
// the btree_gist extension, which a database holds once, in one schema.
// Dropping that extension with CASCADE, or the schema it was created in
// (say another program's, or an old berth schema), drops the constraint of
// every berth table in the database without a word, and from then on the
// store would grant one port twice. So the store checks the constraint
// every time it claims the host's lease and puts it back when it is gone;
// from a check that finds it gone until it is back, it grants nothing.
const (
	// constraintName is the exclusion constraint of migration 1.
	constraintName = "berth_port_allocations_no_conflict"

	qGuarded = "EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'berth_port_allocations'::regclass" +
		" AND conname = '" + constraintName + "' AND contype = 'x')"

	// qGuardLock queues the stores restoring the constraint at once (any schema's: btree_gist is the database's).
	qGuardLock = "SELECT pg_advisory_xact_lock(hashtext('" + constraintName + "'))"

	// qRestoreGuard puts the constraint back as migration 1 made it. It
	// checks every row as it builds the index, so it fails, changing
	// nothing, when rows granted meanwhile conflict.
	qRestoreGuard = "ALTER TABLE berth_port_allocations ADD CONSTRAINT " + constraintName + " EXCLUDE USING gist (" +
		"host_span WITH &&, protocol WITH =, port WITH =, addr_span WITH &&)"
)

// guardError reports that berth's table lost its exclusion constraint and
// the store could not put it back. It wraps store.ErrDamaged.
type guardError struct {
	Err error // why the constraint could not be restored
}

func (e *guardError) Error() string {
	return fmt.Sprintf("the table berth_port_allocations has lost its exclusion constraint %s "+
		"(it goes when the btree_gist extension is dropped with CASCADE, e.g. with the schema it was created in), "+
		"so the store grants no port: restoring it failed: %v", constraintName, e.Err)
}

func (e *guardError) Unwrap() []error { return []error{store.ErrDamaged, e.Err} }

// guard restores the constraint when a claim found it missing, and
// records whether grants may go on.
func (s *Store) guard(ctx context.Context, guarded bool) error {
	if guarded {
		s.guardErr.Store(nil)
		return nil
	}
	err := s.restoreGuard(ctx)
	if err != nil {
		// Open returns it; the background renewal logs it.
		gerr := &guardError{Err: err}
		s.guardErr.Store(gerr)
		return gerr
	}
	s.guardErr.Store(nil)
	s.log.Error(errors.New("constraint "+constraintName+" had been dropped, most likely with the btree_gist extension"),
		"the store's exclusion constraint was missing and is restored; ports granted while it was missing may have gone to two owners",
		"host", s.host)
	return nil
}

// restoreGuard creates btree_gist should it be gone and adds the
// constraint again, in one transaction. Stores that find it missing at
// once queue on an advisory lock and look again once they hold it:
// without it, concurrent CREATE EXTENSIONs collide on the catalog's unique
// index, and a second ADD CONSTRAINT finds the index there.
func (s *Store) restoreGuard(ctx context.Context) error {
	cctx, cancel := s.call(ctx)
	defer cancel()
	err := pgx.BeginFunc(cctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(cctx, qGuardLock); err != nil {
			return err
		}
		var guarded bool
		if err := tx.QueryRow(cctx, "SELECT "+qGuarded).Scan(&guarded); err != nil || guarded {
			return err
		}
		if _, err := tx.Exec(cctx, "CREATE EXTENSION IF NOT EXISTS btree_gist"); err != nil {
			return fmt.Errorf("create the btree_gist extension: %w", err)
		}
		_, err := tx.Exec(cctx, qRestoreGuard)
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ExclusionViolation:
		return fmt.Errorf("rows granted while it was missing conflict (%s); release one of each pair: "+
			"the next Open, or a running store's next renewal of its lease, restores it", pgErr.Detail)
	default:
		return s.fail(ctx, "restore the exclusion constraint", err)
	}
}

// grantable fails when the store is closed or refuses grants (guard).
func (s *Store) grantable() error {
	if gerr := s.guardErr.Load(); gerr != nil && !s.closed.Load() {
		return gerr
	}
	return s.open()
}
