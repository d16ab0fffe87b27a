package statestore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/statestore"
)

// TestTakeOverMovesTheStore: a store with a live reservation of another
// process (still only in the WAL, which that process keeps open), a sticky
// port and an MRU file moves to a new directory whole; the old place is
// left with a note that Open and ReadMoved understand, and a store still
// open there refuses to write.
func TestTakeOverMovesTheStore(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	from := filepath.Join(base, "cache", "berth", "berth.db")
	to := filepath.Join(base, "state", "berth", "berth.db")

	old := openAt(t, from)
	if err := old.Remember(ctx, "api", statestore.TCP, 24321); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, "hold", from, "BERTH_TEST_PORTS=[24322]")
	w.until(t, "done")
	mru := []byte(`{"version":1}` + "\n")
	if err := os.WriteFile(filepath.Join(filepath.Dir(from), "mru.json"), mru, 0o600); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(from + "-wal"); err != nil || fi.Size() == 0 {
		t.Fatalf("the holder's reservation is not in a WAL (%v); the test means to move rows from the WAL", err)
	}

	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{Logger: log, Carry: []string{"mru.json"}, Now: func() time.Time { return at }})
	if err != nil || !moved {
		t.Fatalf("TakeOver(%s, %s) = %v, %v; want true, nil", from, to, moved, err)
	}

	s := openAt(t, to)
	rows := list(t, s)
	if len(rows) != 1 || rows[0].Port != 24322 || rows[0].Owner.PID != w.cmd.Process.Pid {
		t.Errorf("moved store holds %+v; want the holder's 127.0.0.1:24322 (pid %d)", rows, w.cmd.Process.Pid)
	}
	if p, ok, err := s.Recall(ctx, "api", statestore.TCP); err != nil || !ok || p != 24321 {
		t.Errorf("Recall(api) in the moved store = %d, %v, %v; want 24321", p, ok, err)
	}
	if got, err := os.ReadFile(filepath.Join(filepath.Dir(to), "mru.json")); err != nil || string(got) != string(mru) {
		t.Errorf("mru.json in the new directory = %q, %v; want %q", got, err, mru)
	}
	for p, want := range map[string]os.FileMode{filepath.Dir(to): 0o700, to: 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, mode %v; want %04o", p, err, fi.Mode().Perm(), want)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(to))
	for _, e := range entries {
		if strings.Contains(e.Name(), "takeover") {
			t.Errorf("temporary file %s left in the new directory", e.Name())
		}
	}

	m, ok, err := statestore.ReadMoved(from)
	if err != nil || !ok || m.To != to || !m.At.Equal(at) {
		t.Errorf("ReadMoved(%s) = %+v, %v, %v; want To %s, At %v", from, m, ok, err, to, at)
	}
	note, err := os.ReadFile(from)
	if err != nil || !strings.Contains(string(note), to) || !strings.Contains(string(note), "state directory, not a cache directory") {
		t.Errorf("%s after the move = %q, %v; want the note naming %s", from, note, err, to)
	}
	for _, f := range []string{from + "-wal", from + "-shm"} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after the move (%v)", f, err)
		}
	}
	if _, err := statestore.Open(ctx, from, statestore.Options{SweepInterval: -1}); !errors.Is(err, statestore.ErrMoved) || !strings.Contains(err.Error(), to) {
		t.Errorf("Open(%s) after the move = %v; want ErrMoved naming %s", from, err, to)
	}
	// A reader of the old place (an Allocator there that fell back to
	// its MRU file) still sees what the moved store holds.
	if held, err := statestore.ReadHeld(ctx, from); err != nil || held.Len() != 1 {
		t.Errorf("ReadHeld(%s) after the move = %d rows, %v; want the moved store's 1", from, held.Len(), err)
	}
	// A store that was open on the old file writes nothing more there.
	if _, err := old.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24323)}); !errors.Is(err, statestore.ErrMoved) || !strings.Contains(err.Error(), to) {
		t.Errorf("Reserve on a store whose file moved = %v; want ErrMoved naming %s", err, to)
	}
	if moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{}); err != nil || moved {
		t.Errorf("second TakeOver = %v, %v; want false, nil", moved, err)
	}
	if len(logged) == 0 || !strings.Contains(strings.Join(logged, "\n"), `"reservations"=1`) {
		t.Errorf("TakeOver logged %q; want the move with its reservation count", logged)
	}
}

// TestTakeOverNothingToDo: no store at from, an empty file there, a store
// already at to: nothing moves and nothing is created.
func TestTakeOverNothingToDo(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	from := filepath.Join(base, "old", "berth.db")
	to := filepath.Join(base, "new", "berth.db")
	if moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{}); err != nil || moved {
		t.Errorf("TakeOver with no store = %v, %v; want false, nil", moved, err)
	}
	if _, err := os.Stat(filepath.Dir(to)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("TakeOver with no store created %s (%v)", filepath.Dir(to), err)
	}
	if err := os.Mkdir(filepath.Dir(from), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(from, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{}); err != nil || moved {
		t.Errorf("TakeOver of an empty file = %v, %v; want false, nil", moved, err)
	}
	if err := os.Remove(from); err != nil {
		t.Fatal(err)
	}
	openAt(t, from)
	openAt(t, to)
	if moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{}); err != nil || moved {
		t.Errorf("TakeOver onto an existing store = %v, %v; want false, nil", moved, err)
	}
	if _, ok, err := statestore.ReadMoved(from); ok || err != nil {
		t.Errorf("ReadMoved after no move = %v, %v; want no note", ok, err)
	}
}

// TestTakeOverRefusesUnsafe: an old directory that others may write, or
// that another user owns, is refused with ErrUnsafe, and nothing moves.
func TestTakeOverRefusesUnsafe(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, dir string)
	}{
		{"world-writable", func(t *testing.T, dir string) {
			t.Helper()
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
		}},
		{"another owner", func(t *testing.T, dir string) {
			t.Helper()
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a directory to another uid")
			}
			if err := os.Chown(dir, 54321, 54321); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			from := filepath.Join(base, "old", "berth.db")
			to := filepath.Join(base, "new", "berth.db")
			s, err := statestore.Open(ctx, from, statestore.Options{SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24330)}); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tc.spoil(t, filepath.Dir(from))
			moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{})
			if moved || !errors.Is(err, statestore.ErrUnsafe) || !strings.Contains(err.Error(), "nothing was moved") {
				t.Errorf("TakeOver from a %s directory = %v, %v; want ErrUnsafe saying nothing was moved", tc.name, moved, err)
			}
			if _, err := os.Stat(to); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s exists after a refused take-over (%v)", to, err)
			}
			if _, ok, _ := statestore.ReadMoved(from); ok {
				t.Errorf("a refused take-over left a note at %s", from)
			}
			// Made safe again, the old store is as it was.
			if err := os.Chown(filepath.Dir(from), os.Geteuid(), os.Getegid()); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Dir(from), 0o700); err != nil {
				t.Fatal(err)
			}
			if rows := list(t, openAt(t, from)); len(rows) != 1 || rows[0].Port != 24330 {
				t.Errorf("old store after a refused take-over holds %+v; want 127.0.0.1:24330", rows)
			}
		})
	}
}

// TestTakeOverFillsAnEmptyFile: an empty file at the new place (a crash in
// a store's first open leaves one) is no store: the take-over fills it.
func TestTakeOverFillsAnEmptyFile(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	from := filepath.Join(base, "old", "berth.db")
	to := filepath.Join(base, "new", "berth.db")
	s, err := statestore.Open(ctx, from, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remember(ctx, "api", statestore.TCP, 24331); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if moved, err := statestore.TakeOver(ctx, from, to, statestore.TakeOverOptions{}); err != nil || !moved {
		t.Fatalf("TakeOver onto an empty file = %v, %v; want true, nil", moved, err)
	}
	if p, ok, err := openAt(t, to).Recall(ctx, "api", statestore.TCP); err != nil || !ok || p != 24331 {
		t.Errorf("Recall(api) in the filled file = %d, %v, %v; want 24331", p, ok, err)
	}
}

// BenchmarkTakeOver moves a store of 1,000 reservations, the WAL
// unchecked, to a new directory: what the first berth to use a new default
// pays, once.
func BenchmarkTakeOver(b *testing.B) {
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		base := b.TempDir()
		from := filepath.Join(base, "old", "berth.db")
		s, err := statestore.Open(ctx, from, statestore.Options{SweepInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		for p := range 1000 {
			if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, uint16(30000+p))}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		if moved, err := statestore.TakeOver(ctx, from, filepath.Join(base, "new", "berth.db"), statestore.TakeOverOptions{}); err != nil || !moved {
			b.Fatalf("TakeOver = %v, %v", moved, err)
		}
		b.StopTimer()
		_ = s.Close()
		b.StartTimer()
	}
}
