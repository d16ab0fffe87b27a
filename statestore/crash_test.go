package statestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func init() {
	extraWorkers["firstopen"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		_ = out.Encode(event{Event: "starting"})
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return out.Encode(event{Event: "error", Error: err.Error()})
		}
		_ = out.Encode(event{Event: "opened"})
		return s.Close()
	}
	// writer reserves one port per commit from BERTH_TEST_LO on, reporting
	// each after it committed, while another connection checkpoints the
	// WAL into the database file over and over, until it is killed.
	extraWorkers["writer"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return err
		}
		defer s.Close()
		ck, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(50)")
		if err != nil {
			return err
		}
		defer ck.Close()
		go func() {
			for {
				_, _ = ck.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
			}
		}()
		lo, _ := strconv.Atoi(os.Getenv("BERTH_TEST_LO"))
		label := strings.Repeat("w", 200) // fills pages, so checkpoints have work
		for i := 0; ; i++ {
			port := uint16(1 + (lo+i)%65535)
			key := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: port}
			if _, err := s.Reserve(ctx, store.Request{Key: key, Label: label}); err != nil {
				return err
			}
			_ = out.Encode(event{Event: "grant", Port: port})
		}
	}
}

// TestKillDuringFirstOpen: a process killed at a random moment of the very
// first Open of a store (creating the file, setting WAL mode, migrating)
// leaves a file that the next Open takes up and finishes.
func TestKillDuringFirstOpen(t *testing.T) {
	ctx := context.Background()
	const tries = 100
	// How long a first Open takes here, to spread the kills over it.
	start := time.Now()
	openAt(t, filepath.Join(t.TempDir(), "timing.db"))
	span := max(time.Since(start)*3/2, 5*time.Millisecond)
	opened := 0
	for i := range tries {
		path := filepath.Join(t.TempDir(), "berth.db")
		w := startWorker(t, "firstopen", path)
		w.until(t, "starting")
		time.Sleep(rand.N(span))
		w.kill(t)
		if _, err := os.Stat(path); err == nil {
			opened++
		}
		s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatalf("try %d: Open after a kill during the first Open: %v", i, err)
		}
		key := tcp(lo4, uint16(30000+i))
		if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
			t.Fatalf("try %d: Reserve after recovery: %v", i, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		checkSchema(t, path)
	}
	t.Logf("%d of %d kills left a file behind (span %v)", opened, tries, span)
}

// TestKillDuringCheckpoint: a writer killed while checkpoints copy the WAL
// into the database file leaves a store that opens with every row the
// writer had committed.
func TestKillDuringCheckpoint(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	if err := openAt(t, path).Close(); err != nil {
		t.Fatal(err)
	}
	const tries = 100
	for i := range tries {
		lo := i * 400
		w := startWorker(t, "writer", path, "BERTH_TEST_LO="+strconv.Itoa(lo))
		want := 20 + rand.IntN(300)
		var got []uint16
		for len(got) < want {
			e := w.next(t)
			if e.Event != "grant" {
				t.Fatalf("try %d: worker event %+v", i, e)
			}
			got = append(got, e.Port)
		}
		w.kill(t)
		s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatalf("try %d: Open after a kill during checkpoints: %v", i, err)
		}
		rows, err := s.List(ctx, store.Filter{})
		if err != nil {
			t.Fatalf("try %d: List: %v", i, err)
		}
		have := map[uint16]bool{}
		for _, r := range rows {
			if r.Owner.PID == w.cmd.Process.Pid {
				have[r.Port] = true
			}
		}
		for _, p := range got {
			if !have[p] {
				t.Fatalf("try %d: port %d was committed before the kill and is missing after it (%d rows of the writer found, %d committed)", i, p, len(have), len(got))
			}
		}
		if _, err := s.Reap(ctx); err != nil {
			t.Fatalf("try %d: Reap: %v", i, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiskFullOnFirstOpen: on a file system with 0 to 100 KiB free, the
// first Open may fail, with a clear error; once space is freed the store
// opens and works, never refused as damaged.
func TestDiskFullOnFirstOpen(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs; run the tests as root to include it")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v: %s); skipping the disk-full test", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	ctx := context.Background()
	failed := 0
	for free := 0; free <= 100; free++ {
		state := filepath.Join(dir, fmt.Sprintf("s%d", free))
		ballast := filepath.Join(dir, "ballast")
		if err := fillTo(dir, ballast, int64(free)*1024); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(state, "berth.db")
		s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err == nil {
			_ = s.Close()
		} else {
			failed++
			if errors.Is(err, store.ErrDamaged) {
				t.Fatalf("%d KiB free: Open = %v; a full disk is not damage", free, err)
			}
		}
		if err := os.Remove(ballast); err != nil {
			t.Fatal(err)
		}
		s, err = statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatalf("%d KiB free, then freed: Open = %v; want the store", free, err)
		}
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 30000)}); err != nil {
			t.Fatalf("%d KiB free, then freed: Reserve = %v", free, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(state); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("first Open failed at %d of 101 free-space levels, and recovered at every one", failed)
}

// fillTo writes a file at path that leaves about free bytes of dir's file
// system unused.
func fillTo(dir, path string, free int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		avail, err := freeBytes(dir)
		if err != nil {
			return err
		}
		if avail <= free {
			return nil
		}
		n := min(int64(len(buf)), avail-free)
		if _, err := f.Write(buf[:n]); err != nil {
			return nil // full: as little as possible is left
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
}

// TestDirtyMigrationResolved: a dirty mark left by a migration cut short
// (by an older berth, whose runner marked versions dirty before running
// them) is resolved from schema_history: a body that committed stands, one
// that left no trace runs again. Rows are kept either way.
func TestDirtyMigrationResolved(t *testing.T) {
	ctx := context.Background()
	for _, committed := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), "berth.db")
		s := openAt(t, path)
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 30200), Label: "kept"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		last := int(statestore.SchemaVersion)
		stmts := []string{fmt.Sprintf("UPDATE schema_migrations SET version = %d, dirty = 1", last)}
		if !committed {
			// The last migration's body left no trace: undo it with its
			// down file, which also deletes its schema_history record.
			downs, _ := filepath.Glob(fmt.Sprintf("migrations/%d_*.down.sql", last))
			if len(downs) != 1 {
				t.Fatalf("down files of migration %d: %v; want one", last, downs)
			}
			b, err := os.ReadFile(downs[0])
			if err != nil {
				t.Fatal(err)
			}
			stmts = append(stmts, string(b))
		}
		for _, q := range stmts {
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		_ = db.Close()
		s, err = statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatalf("Open of a store left dirty (body committed: %v) = %v; want it resolved", committed, err)
		}
		rs, err := s.List(ctx, store.Filter{})
		if err != nil || len(rs) != 1 || rs[0].Label != "kept" {
			t.Errorf("rows after resolving (body committed: %v) = %v, %v; want the one kept", committed, rs, err)
		}
		_ = s.Close()
		checkSchema(t, path)
	}
}
