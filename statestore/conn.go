package statestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	sqlite "modernc.org/sqlite"
)

// openDB returns a database handle on dsn whose connections keep the WAL
// and shared-memory files when they close (SQLITE_FCNTL_PERSIST_WAL).
// Otherwise the last connection deletes both, and the next process makes
// them again, fsyncing the directory and the WAL header: most of what a
// short-lived process (`berth get`, a test binary) paid for its first
// port. SQLite validates kept files by their checksums and salts, so a
// file left by a crash is read as before.
func openDB(dsn string) (*sql.DB, error) {
	base, err := sqlite.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(persistWAL{base}), nil
}

type persistWAL struct{ driver.Connector }

func (c persistWAL) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	fc, ok := conn.(sqlite.FileControl)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("SQLite driver connection %T has no file control", conn)
	}
	if _, err := fc.FileControlPersistWAL("main", 1); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("keep WAL files: %w", err)
	}
	return conn, nil
}
