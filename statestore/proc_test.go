package statestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestMultiProcess: six processes reserve random ports of a 300-port window
// on random addresses at once. Afterwards no two rows conflict, and every
// grant a worker reported is in the table under that worker.
func TestMultiProcess(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	const workers, attempts, lo = 6, 100, 30000
	ws := make([]*worker, workers)
	for i := range ws {
		ws[i] = startWorker(t, "random", path, fmt.Sprintf("BERTH_TEST_LO=%d", lo), fmt.Sprintf("BERTH_TEST_N=%d", attempts))
	}
	for _, w := range ws {
		_, _ = w.stdin.Write([]byte{1})
	}
	// A worker that draws a key it already holds gets its row back
	// (Reserve is idempotent), so grants are counted once per key.
	grants := map[int]map[event]bool{}
	total := 0
	for _, w := range ws {
		pid := w.cmd.Process.Pid
		grants[pid] = map[event]bool{}
		for _, e := range w.until(t, "done") {
			if e.Event == "grant" && !grants[pid][e] {
				grants[pid][e] = true
				total++
			}
		}
	}
	rows := list(t, s)
	if len(rows) != total {
		t.Errorf("table has %d rows; workers reported %d grants", len(rows), total)
	}
	for i, a := range rows {
		for _, b := range rows[i+1:] {
			if a.Protocol == b.Protocol && a.Port == b.Port && netaddr.Conflicts(a.Addr, b.Addr) {
				t.Errorf("conflicting rows: %s (pid %d) and %s (pid %d)", a.Key, a.Owner.PID, b.Key, b.Owner.PID)
			}
		}
	}
	byKey := map[store.Key]store.Reservation{}
	for _, r := range rows {
		byKey[r.Key] = r
	}
	for pid, evs := range grants {
		for e := range evs {
			k := tcp(netip.MustParseAddr(e.Addr), e.Port)
			if r, ok := byKey[k]; !ok || r.Owner.PID != pid {
				t.Errorf("grant %s to pid %d: table has %+v", k, pid, r)
			}
		}
	}
	t.Logf("%d workers made %d grants out of %d attempts", workers, total, workers*attempts)
	if total == 0 {
		t.Fatal("no grants at all")
	}
	_ = ctx
}

// TestCrashedOwnerIsReaped: a worker reserves ports and is SIGKILLed; the
// parent then reserves the same keys, and the reaped count says why.
func TestCrashedOwnerIsReaped(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	ports := []uint16{31000, 31001, 31002, 31003}
	pj, _ := json.Marshal(ports)
	w := startWorker(t, "hold", path, "BERTH_TEST_PORTS="+string(pj))
	w.until(t, "done")
	for _, p := range ports {
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, p)}); !isHeld(err) {
			t.Fatalf("Reserve(%d) while the worker lives = %v; want ErrHeld", p, err)
		}
	}
	w.kill(t)
	for _, p := range ports {
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, p)}); err != nil {
			t.Fatalf("Reserve(%d) after SIGKILL = %v; want success", p, err)
		}
	}
	if got := s.Stats().Reaped; got != int64(len(ports)) {
		t.Errorf("Stats().Reaped = %d; want %d", got, len(ports))
	}
}

// TestMigrationRace: eight processes open the same fresh file at the same
// moment, twenty times over. Every open succeeds, the schema ends at the
// latest version and clean, and each migration ran exactly once.
func TestMigrationRace(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns 160 processes")
	}
	const procs, rounds = 8, 20
	for round := range rounds {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("race-%d", round), "berth.db")
		ws := make([]*worker, procs)
		for i := range ws {
			ws[i] = startWorker(t, "open", path)
		}
		for _, w := range ws { // the go signal, as close together as we can
			_, _ = w.stdin.Write([]byte{1})
		}
		for _, w := range ws {
			if e := w.next(t); e.Event != "opened" {
				t.Fatalf("round %d: worker pid %d: %s %s", round, w.cmd.Process.Pid, e.Event, e.Error)
			}
			if err := w.cmd.Wait(); err != nil {
				t.Fatalf("round %d: worker pid %d: %v", round, w.cmd.Process.Pid, err)
			}
		}
		checkSchema(t, path)
	}
}

func checkSchema(tb testing.TB, path string) {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	var (
		version int
		dirty   bool
	)
	if err := db.QueryRow("SELECT version, dirty FROM schema_migrations").Scan(&version, &dirty); err != nil {
		tb.Fatal(err)
	}
	if uint(version) != statestore.SchemaVersion || dirty {
		tb.Errorf("schema version %d dirty=%v; want %d clean", version, dirty, statestore.SchemaVersion)
	}
	rows, err := db.Query("SELECT version, count(*) FROM schema_history GROUP BY version")
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var v, n int
		if err := rows.Scan(&v, &n); err != nil {
			tb.Fatal(err)
		}
		seen++
		if n != 1 {
			tb.Errorf("migration %d ran %d times; want once", v, n)
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	if uint(seen) != statestore.SchemaVersion {
		tb.Errorf("schema_history has %d migrations; want %d", seen, statestore.SchemaVersion)
	}
}

// TestForeignWriteLock: a program outside berth holds the database's write
// lock. A call waits up to BusyTimeout, or less when its context ends first,
// then fails with ErrBusy (waiting, not damage); once the lock is gone the
// store works again.
func TestForeignWriteLock(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1, BusyTimeout: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := startWorker(t, "locker", path)
	w.until(t, "locked")

	start := time.Now()
	_, err = s.Reserve(ctx, store.Request{Key: tcp(lo4, 32000)})
	if !errors.Is(err, store.ErrBusy) || errors.Is(err, store.ErrStorage) {
		t.Errorf("Reserve under a foreign lock = %v; want ErrBusy and not ErrStorage", err)
	}
	t.Logf("gave up after %v (BusyTimeout 400ms)", time.Since(start))

	cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel()
	_, err = s.Reserve(cctx, store.Request{Key: tcp(lo4, 32000)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Reserve with a short context under a foreign lock = %v; want DeadlineExceeded", err)
	}

	_ = w.stdin.Close()
	_ = w.cmd.Wait()
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 32000)}); err != nil {
		t.Errorf("Reserve after the lock is gone = %v", err)
	}
}

// TestScanRechecksBeforeExhaustion: a scan passes over a port whose holder
// it remembers alive; when that holder has just died, the scan must find
// out before it reports the candidates exhausted.
func TestScanRechecksBeforeExhaustion(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	w := startWorker(t, "hold", path, "BERTH_TEST_PORTS=[31500]")
	w.until(t, "done")
	only := func() func() (uint16, bool) {
		done := false
		return func() (uint16, bool) {
			if done {
				return 0, false
			}
			done = true
			return 31500, true
		}
	}
	if _, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: only()}); !errors.Is(err, store.ErrExhausted) {
		t.Fatalf("Scan with the holder alive = %v; want ErrExhausted", err)
	}
	w.kill(t)
	r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: only()})
	if err != nil || r.Port != 31500 {
		t.Fatalf("Scan right after the holder died = %+v, %v; want port 31500", r, err)
	}
}
