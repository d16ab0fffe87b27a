// Package pgschema makes throwaway PostgreSQL schemas for berth's tests and
// torture runs: each gets a schema of its own on a shared server, so that
// no row of one meets another's, and drops it when done.
//
// berth's first migration creates the btree_gist extension in the first
// schema of the search path; dropping a throwaway schema that held it
// would drop the exclusion constraint of every other schema's berth
// tables. So Create makes sure the extension exists outside the throwaway
// schema before it creates one.
package pgschema

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Create makes a schema named prefix followed by a random number on the
// server dsn names and returns dsn with its search_path set to that
// schema, and a function that drops the schema and everything in it. The
// drop runs even when ctx has ended.
func Create(ctx context.Context, dsn, prefix string) (scoped string, drop func() error, err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", nil, err
	}
	if err := ensureExtension(ctx, conn); err != nil {
		_ = conn.Close(ctx)
		return "", nil, err
	}
	schema := fmt.Sprintf("%s_%d", prefix, rand.Uint64()>>1)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		_ = conn.Close(ctx)
		return "", nil, fmt.Errorf("create schema %s: %w", schema, err)
	}
	after := context.WithoutCancel(ctx)
	drop = func() error {
		defer func() { _ = conn.Close(after) }()
		_, err := conn.Exec(after, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		return err
	}
	return WithParam(dsn, "search_path", schema), drop, nil
}

// ErrNoCreateDB is CreateDatabase's error for a role that may not create
// databases.
var ErrNoCreateDB = errors.New("the role may not create databases")

// CreateDatabase makes a database named prefix followed by a random
// number on the server dsn names, for a test that needs one of its own,
// and returns a key=value dsn for it and a function that drops it, ending
// the connections still open to it. A role without CREATEDB gets an error
// wrapping ErrNoCreateDB.
func CreateDatabase(ctx context.Context, dsn, prefix string) (scoped string, drop func() error, err error) {
	if strings.Contains(dsn, "://") {
		return "", nil, errors.New("create a database: want a key=value DSN, not a URL")
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", nil, err
	}
	name := fmt.Sprintf("%s_%d", prefix, rand.Uint64()>>1)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		_ = conn.Close(ctx)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
			err = fmt.Errorf("%w: %w", ErrNoCreateDB, err)
		}
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	after := context.WithoutCancel(ctx)
	drop = func() error {
		defer func() { _ = conn.Close(after) }()
		_, err := conn.Exec(after, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		return err
	}
	return WithParam(dsn, "dbname", name), drop, nil
}

// ensureExtension creates btree_gist in the first schema of conn's
// search_path unless the database has it, trying twice: two connections
// creating it at once can collide on the catalog's unique index.
func ensureExtension(ctx context.Context, conn *pgx.Conn) error {
	var err error
	for range 2 {
		_, err = conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS btree_gist")
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.UniqueViolation {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("create the btree_gist extension outside the throwaway schema (it must outlive it): %w", err)
	}
	return nil
}

// WithParam sets a parameter in a key=value or URL connection string;
// pgx sends one it does not know, such as search_path, to the server as a
// run-time parameter.
func WithParam(dsn, name, value string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " " + name + "=" + value
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn // pgx reports the DSN's error when it connects
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}
