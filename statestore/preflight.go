package statestore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// sqliteMagic opens every SQLite 3 database file.
var sqliteMagic = []byte("SQLite format 3\x00")

// ourTables are the tables a berth database may hold; a database with any
// other table belongs to another program.
var ourTables = map[string]bool{
	"port_allocations":  true,
	"schema_history":    true,
	"sticky_ports":      true,
	"schema_migrations": true, // golang-migrate's version table
}

// preflight decides, without writing a byte to an existing file, whether
// path may be opened for writing: it does not exist or is empty (a new
// store, which it initialises), or it is an intact berth database. Opening a
// file read-write is not harmless: setting the WAL journal mode alone
// rewrites its header. The caller holds the migration lock.
func preflight(ctx context.Context, path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return initFile(ctx, path)
	}
	if err != nil {
		return fmt.Errorf("statestore: %s: %w", path, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("statestore: %s is a directory, not a database file; remove it or set another state directory: %w", path, ErrDamaged)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("statestore: %s is not a regular file: %w", path, ErrDamaged)
	}
	if fi.Size() == 0 {
		return initFile(ctx, path)
	}
	if err := checkHeader(path, fi.Size()); err != nil {
		return err
	}
	return checkContents(ctx, path)
}

// pageSize is the page size of new databases. Rows are small and every
// commit writes whole pages to the WAL, so small pages make commits cheaper.
const pageSize = 1024

// initFile creates a new database file with mode 0600 (SQLite keeps that
// mode for the -wal and -shm files it creates beside it), then sets its page
// size and WAL mode, which only a new database can still take.
func initFile(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("statestore: create %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("statestore: create %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsnBare(path)+fmt.Sprintf("?_pragma=page_size(%d)", pageSize))
	if err != nil {
		return fmt.Errorf("statestore: create %s: %w", path, err)
	}
	defer func() { _ = db.Close() }()
	if _, err := db.ExecContext(ctx, "PRAGMA journal_mode=WAL"); err != nil {
		return fmt.Errorf("statestore: create %s: %w", path, err)
	}
	return nil
}

// checkHeader reads the 100-byte SQLite header and checks the file against
// it: a foreign file fails the magic, a truncated one the size.
func checkHeader(path string, size int64) error {
	damaged := func(why string) error {
		return fmt.Errorf("statestore: %s %s; move it aside to start a new store (berth never overwrites it): %w", path, why, ErrDamaged)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("statestore: %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	var h [100]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		if bytes.HasPrefix(sqliteMagic, h[:min(int(size), len(sqliteMagic))]) {
			return damaged(fmt.Sprintf("is truncated (%d bytes, shorter than a SQLite header)", size))
		}
		return damaged("is not a SQLite database")
	}
	if !bytes.Equal(h[:16], sqliteMagic) {
		return damaged("is not a SQLite database")
	}
	pageSize := int64(binary.BigEndian.Uint16(h[16:18]))
	if pageSize == 1 {
		pageSize = 65536
	}
	if pageSize < 512 || pageSize&(pageSize-1) != 0 {
		return damaged(fmt.Sprintf("has a damaged header (page size %d)", pageSize))
	}
	if size%pageSize != 0 {
		return damaged(fmt.Sprintf("is truncated (%d bytes is not a whole number of %d-byte pages)", size, pageSize))
	}
	// The page count in the header is valid when the change counter and its
	// "valid for" copy agree.
	if binary.BigEndian.Uint32(h[24:28]) == binary.BigEndian.Uint32(h[92:96]) {
		pages := int64(binary.BigEndian.Uint32(h[28:32]))
		if pages*pageSize > size {
			return damaged(fmt.Sprintf("is truncated (%d bytes; its header says %d)", size, pages*pageSize))
		}
	}
	return nil
}

// checkContents opens the file read-only and checks that it is intact and
// holds only berth's tables.
func checkContents(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", dsn(path, time.Second, true))
	if err != nil {
		return fmt.Errorf("statestore: %s: %w", path, err)
	}
	defer func() { _ = db.Close() }()
	var res string
	if err := db.QueryRowContext(ctx, "PRAGMA quick_check(1)").Scan(&res); err != nil {
		return fmt.Errorf("statestore: check %s: %w: %w", path, ErrDamaged, err)
	}
	if res != "ok" {
		return fmt.Errorf("statestore: %s is damaged (%s); move it aside to start a new store: %w", path, res, ErrDamaged)
	}
	rows, err := db.QueryContext(ctx, "SELECT name FROM sqlite_schema WHERE type = 'table'")
	if err != nil {
		return fmt.Errorf("statestore: check %s: %w", path, err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return fmt.Errorf("statestore: check %s: %w", path, err)
		}
		if !ourTables[name] {
			return fmt.Errorf("statestore: %s is a SQLite database of another program (it has table %q); choose another path: %w", path, name, ErrDamaged)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("statestore: check %s: %w", path, err)
	}
	return nil
}
