package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// TestHotLookupsUseTheConstraintIndex: the conflict lookups of Reserve,
// Scan and ReserveFleet can be served by the exclusion constraint's GiST
// index. Sequential scans are turned off, so the test asks whether the
// index applies, not whether the planner prefers it on a tiny table.
func TestHotLookupsUseTheConstraintIndex(t *testing.T) {
	dsn, conn := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 57000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		q    string
		args []any
	}{
		{"holders", pgstore.QHolders, []any{int32(1), "tcp", []int32{57000, 57001}, "127.0.0.1"}},
		{"scan", pgstore.QScan, []any{int32(1), "tcp", "127.0.0.1", "dynamic", []int32{57000, 57001}, 1, int64(1), "", "", ""}},
		{"fleet", pgstore.QFleetReserve, []any{"tcp", "0.0.0.0", int32(57000), int32(57100), "pod/default/web-0", int64(60000), "", int32(50)}},
	} {
		rows, err := conn.Query(ctx, "EXPLAIN "+c.q, c.args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "berth_port_allocations_no_conflict") || strings.Contains(text, "Seq Scan on berth_port_allocations") {
			t.Errorf("%s: plan does not use the exclusion constraint's index:\n%s", c.name, text)
		}
	}
}
