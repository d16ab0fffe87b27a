package statestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
)

// TestConflictQueryUsesPrimaryKey guards the hot lookup: finding the rows
// of one (protocol, port) must be a range scan of the primary key, never a
// scan of the table.
func TestConflictQueryUsesPrimaryKey(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := Open(ctx, path, Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{qConflicts, qDeleteKey, qDeleteOwned, qTransfer} {
		plan := explain(t, db, q)
		if strings.Contains(plan, "SCAN port_allocations") {
			t.Errorf("plan of %q is a table scan:\n%s", q, plan)
		}
		if !strings.Contains(plan, "SEARCH port_allocations USING") {
			t.Errorf("plan of %q does not search an index:\n%s", q, plan)
		}
	}
	if plan := explain(t, db, qConflicts); !strings.Contains(plan, "PRIMARY KEY (protocol=? AND port=?)") {
		t.Errorf("conflict lookup does not range-scan the primary key:\n%s", plan)
	}
}

func explain(tb testing.TB, db *sql.DB, q string) string {
	tb.Helper()
	args := make([]any, strings.Count(q, "?"))
	for i := range args {
		args[i] = 1
	}
	rows, err := db.Query("EXPLAIN QUERY PLAN "+q, args...)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			tb.Fatal(err)
		}
		b.WriteString(detail + "\n")
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return b.String()
}
