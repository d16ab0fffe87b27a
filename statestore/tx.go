package statestore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berth-go/berth/store"
)

// write runs fn in one BEGIN IMMEDIATE transaction, committed when fn
// returns nil. fn's context does not cancel statements (an interrupted one
// can leave the connection in a state only ROLLBACK clears); fn checks ctx
// between steps instead.
func (s *sqlStore) write(ctx context.Context, op string, fn func(tctx context.Context) error) error {
	return s.writing(ctx, op, func(tctx context.Context) error {
		if err := s.retryBusy(ctx, func() error {
			_, err := s.st.exec(tctx, qBegin)
			return err
		}); err != nil {
			return storageErr(op, err)
		}
		committed := false
		defer func() { //nolint:contextcheck // a rollback must run whatever became of ctx
			// Also after a panic in fn (a caller's probe, a bug): the
			// shared connection must not stay inside the transaction.
			if !committed {
				s.rollback()
			}
		}()
		if err := fn(tctx); err != nil {
			return err
		}
		if _, err := s.st.exec(tctx, qCommit); err != nil {
			return storageErr(op, err)
		}
		committed = true
		s.committed()
		return nil
	})
}

// exec runs one autocommit write statement and returns the rows it changed.
// done, when not nil, runs with the store still acquired.
func (s *sqlStore) exec(ctx context.Context, op string, done func(n int64), q string, args ...any) (int64, error) {
	var n int64
	err := s.writing(ctx, op, func(tctx context.Context) error {
		if err := s.retryBusy(ctx, func() error {
			res, err := s.st.exec(tctx, q, args...)
			if err == nil {
				n, err = res.RowsAffected()
			}
			return err
		}); err != nil {
			s.cache.valid = false // a failed transaction
			return storageErr(op, err)
		}
		s.committed()
		if done != nil {
			done(n)
		}
		return nil
	})
	return n, err
}

func (s *sqlStore) writing(ctx context.Context, op string, body func(tctx context.Context) error) error {
	release, err := s.acquire(ctx, true)
	if err != nil {
		return acquireErr(op, err)
	}
	defer release()
	err = body(context.WithoutCancel(ctx))
	// The file may have been deleted meanwhile: its rows would then be
	// where nobody looks. A failed write is checked too: a file truncated
	// under the connection fails with "no such table" or as damaged, which
	// is its loss, not a failure of the store.
	if lost := s.lostErr(err); lost != nil {
		err = lost
	}
	return s.explain(err)
}

// lostErr returns, after a write that returned err, the error to return
// instead when the file was lost meanwhile (sameFile, unreadable), else nil.
func (s *sqlStore) lostErr(err error) error {
	if err != nil && (errors.Is(err, store.ErrLost) || !errors.Is(err, store.ErrStorage)) {
		return nil // a refusal, a conflict, a busy store: the file served it
	}
	serr := s.sameFile()
	if serr == nil && unreadable(err) {
		serr = fmt.Errorf("%s-wal lacks frames its index names (another process wrote to one removed since): %w", s.path, store.ErrLost)
	}
	if serr == nil || err == nil {
		return serr
	}
	return fmt.Errorf("%w (the transaction failed with: %s)", serr, err.Error()) // not wrapped: it is no failure of the store
}

func acquireErr(op string, err error) error {
	if errors.Is(err, store.ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, store.ErrLost) {
		return fmt.Errorf("%s: %w", op, err)
	}
	return storageErr(op, err)
}

func (s *sqlStore) rollback() {
	s.cache.valid = false // the view's changes are rolled back
	if _, err := s.st.exec(context.Background(), qRollback); err != nil {
		// Expected after a failed COMMIT: "no transaction is active".
		s.log.V(1).Info("rollback failed", "error", err.Error())
	}
}

// busySlice is the connection's busy_timeout: how long SQLite sleep-polls
// for a lock before retryBusy looks at the context again.
const busySlice = 100 * time.Millisecond

// retryBusy retries fn on SQLITE_BUSY until ctx ends or BusyTimeout passes.
// Berth's own writers queue on the flock and rarely meet SQLITE_BUSY; this
// waits out a lock held by something else (the sqlite3 shell, a checkpoint).
func (s *sqlStore) retryBusy(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(s.busy)
	for {
		err := fn()
		if err == nil || !isBusy(err) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the database is locked by another process (%w): %w: %w", err, store.ErrBusy, ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the database stayed locked by another process for %v (%w): %w", s.busy, err, store.ErrBusy)
		}
	}
}

// explain adds what to check to errors of the file system.
func (s *sqlStore) explain(err error) error {
	code := sqliteCode(err)
	if code == 0 {
		return err
	}
	// A write that failed for want of space SQLite reports as an I/O
	// error, short of ENOSPC: look at the file system.
	var fe *storageError
	if errors.As(err, &fe) && fe.short == nil {
		fe.short = shortage(fe.err, filepath.Dir(s.path))
	}
	if errors.Is(err, store.ErrTransient) {
		return err // its message says what ran short
	}
	switch code {
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM:
		if code == sqlite3.SQLITE_READONLY && writable(s.path) && writable(filepath.Dir(s.path)) {
			// SQLite opens a file, or its shared memory, read-only when it cannot
			// write it then (descriptors short, the file immutable), until reopened.
			return fmt.Errorf("%w; the file %s is writable, but the store's connection was opened read-only: %w (%w)", err, s.path, store.ErrLost, store.ErrTransient)
		}
		return fmt.Errorf("%w; check that %s is writable and its file system not full", err, filepath.Dir(s.path))
	}
	return err
}
