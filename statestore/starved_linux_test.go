package statestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/statestore"
)

// In the mode "starved" a worker leaves itself BERTH_TEST_SPARE file
// descriptors (RLIMIT_NOFILE just above those it has open), opens the
// store and lists its rows, and reports what became of it. With
// BERTH_TEST_SELF_FIRST=1 it knows its own identity before it runs short,
// as a program that has used berth before does, so that the open's first
// steps meet the shortage.
func init() {
	extraWorkers["starved"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		spare, err := strconv.Atoi(os.Getenv("BERTH_TEST_SPARE"))
		if err != nil {
			return err
		}
		if os.Getenv("BERTH_TEST_SELF_FIRST") == "1" {
			if _, err := statestore.Self(); err != nil {
				return err
			}
		}
		if err := testproc.LeaveSpareFDs(spare); err != nil {
			return err
		}
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err == nil {
			_, err = s.List(ctx, statestore.Filter{})
			_ = s.Close()
		}
		if err != nil {
			return out.Encode(starvedEvent{Error: err.Error(), Transient: errors.Is(err, statestore.ErrTransient), Storage: errors.Is(err, statestore.ErrStorage)})
		}
		return out.Encode(starvedEvent{})
	}
}

type starvedEvent struct {
	Error     string `json:"error,omitempty"`
	Transient bool   `json:"transient,omitempty"`
	Storage   bool   `json:"storage,omitempty"`
}

// TestOpenOutOfDescriptors: SQLite reports a database it could not open
// for want of a descriptor as SQLITE_CANTOPEN, without the errno, just as
// it reports a missing directory. The store must tell them apart: with
// fewer descriptors to spare than it needs, every failure to open a new
// store or an existing one wraps ErrTransient and says too many files are
// open, and none wraps ErrStorage, which would make a caller fall back.
func TestOpenOutOfDescriptors(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.db")
	s, err := statestore.Open(context.Background(), existing, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{existing, filepath.Join(dir, "new.db")} {
		for _, selfFirst := range []string{"0", "1"} {
			failed, opened := 0, 0
			for spare := range 12 {
				if path != existing {
					for _, suffix := range []string{"", "-wal", "-shm", ".lock", ".migrate.lock"} {
						_ = os.Remove(path + suffix)
					}
				}
				w := startWorker(t, "starved", path, "BERTH_TEST_SPARE="+strconv.Itoa(spare), "BERTH_TEST_SELF_FIRST="+selfFirst,
					"GORACE=atexit_sleep_ms=0") // under -race a worker would sleep a second as it exits
				if !w.events.Scan() {
					t.Fatalf("worker with %d spare descriptors said nothing", spare)
				}
				var ev starvedEvent
				if err := json.Unmarshal(w.events.Bytes(), &ev); err != nil {
					t.Fatalf("worker said %q", w.events.Text())
				}
				switch {
				case ev.Error == "":
					opened++
				case ev.Transient && !ev.Storage && strings.Contains(ev.Error, "too many open files"):
					failed++
				default:
					t.Errorf("Open and List of %s with %d spare descriptors (identity known first: %s) = %+v; want an error wrapping ErrTransient and not ErrStorage, saying too many open files",
						filepath.Base(path), spare, selfFirst, ev)
				}
			}
			if failed == 0 || opened == 0 {
				t.Errorf("%s (identity known first: %s): %d runs failed and %d opened; want both", filepath.Base(path), selfFirst, failed, opened)
			}
		}
	}
}

// In the mode "unmarked" a worker opens the store, reserves port 24121,
// leaves itself no descriptor to spare and reserves port 24122, and
// reports what became of it.
func init() {
	extraWorkers["unmarked"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return err
		}
		defer s.Close()
		if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24121)}); err != nil {
			return err
		}
		if err := testproc.LeaveSpareFDs(0); err != nil {
			return err
		}
		_, err = s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24122)})
		if err != nil {
			return out.Encode(starvedEvent{Error: err.Error(), Transient: errors.Is(err, statestore.ErrTransient), Storage: errors.Is(err, statestore.ErrStorage)})
		}
		return out.Encode(starvedEvent{})
	}
}

// TestUnmarkedReservationRefused: a reservation this process makes for
// itself is granted only with its mark, which keeps it should the store be
// lost; with no descriptor left for the mark, Reserve fails with
// ErrTransient and records nothing.
func TestUnmarkedReservationRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	w := startWorker(t, "unmarked", path)
	var ev starvedEvent
	if !w.events.Scan() || json.Unmarshal(w.events.Bytes(), &ev) != nil {
		t.Fatalf("worker said %q", w.events.Text())
	}
	if !ev.Transient || ev.Storage || !strings.Contains(ev.Error, "too many open files") {
		t.Fatalf("Reserve with no descriptor for its mark = %+v; want ErrTransient, not ErrStorage, saying too many open files", ev)
	}
	s := openAt(t, path)
	rows, err := s.List(context.Background(), statestore.Filter{Port: 24122})
	if err != nil || len(rows) != 0 {
		t.Fatalf("rows of port 24122 = %v, %v; want none", rows, err)
	}
}

// In the mode "unmarked-transfer" a worker opens the store, reserves port
// 24123, leaves itself no descriptor to spare and hands the row to its
// parent (the test), and reports what became of it.
func init() {
	extraWorkers["unmarked-transfer"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return err
		}
		defer s.Close()
		if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(lo4, 24123)}); err != nil {
			return err
		}
		parent, err := statestore.LookupOwner(ctx, os.Getppid())
		if err != nil {
			return err
		}
		if err := testproc.LeaveSpareFDs(0); err != nil {
			return err
		}
		if err := s.Transfer(ctx, tcp(lo4, 24123), statestore.Owner{}, parent); err != nil {
			return out.Encode(starvedEvent{Error: err.Error(), Transient: errors.Is(err, statestore.ErrTransient), Storage: errors.Is(err, statestore.ErrStorage)})
		}
		return out.Encode(starvedEvent{})
	}
}

// TestUnmarkedTransferRefused: a row is handed to another process only
// with that process's mark, which keeps it should the store be lost while
// it lives; with no descriptor left for the mark, Transfer fails with
// ErrTransient and the row stays its owner's.
func TestUnmarkedTransferRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	w := startWorker(t, "unmarked-transfer", path)
	var ev starvedEvent
	if !w.events.Scan() || json.Unmarshal(w.events.Bytes(), &ev) != nil {
		t.Fatalf("worker said %q", w.events.Text())
	}
	if !ev.Transient || ev.Storage || !strings.Contains(ev.Error, "too many open files") {
		t.Fatalf("Transfer with no descriptor for the new owner's mark = %+v; want ErrTransient, not ErrStorage, saying too many open files", ev)
	}
	s := openAt(t, path)
	rows, err := s.List(context.Background(), statestore.Filter{Port: 24123})
	if err != nil || len(rows) != 1 || rows[0].Owner.PID != w.cmd.Process.Pid {
		t.Fatalf("rows of port 24123 = %v, %v; want the worker's (pid %d)", rows, err, w.cmd.Process.Pid)
	}
}

// TestFreshStoreWholeOrNotAtAll: a process that makes a new store where a
// live holder's was lost, and fails to take in the holder's marks (short of
// descriptors, say), leaves no store at the path: the next process to open
// it makes it again, with the holder's reservations.
func TestFreshStoreWholeOrNotAtAll(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	ports := []uint16{24131, 24132}
	list, _ := json.Marshal(ports)
	h := startWorker(t, "hold", path, "BERTH_TEST_PORTS="+string(list))
	if e := h.next(t); e.Event != "done" {
		t.Fatalf("holder: %+v", e)
	}
	if err := os.RemoveAll(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	short := errors.New("too many open files (a test's)")
	statestore.FailImports(t, short)
	if s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1}); !errors.Is(err, short) {
		if err == nil {
			_ = s.Close()
		}
		t.Fatalf("Open of a new store whose import of the marks fails = %v; want that failure", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the failed import, %s: %v; want no file", path, err)
	}
	statestore.FailImports(t, nil)
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.List(ctx, statestore.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint16
	for _, r := range rows {
		got = append(got, r.Port)
	}
	if !slices.Equal(got, ports) {
		t.Fatalf("rows of the store made next = %v; want the live holder's %v", got, ports)
	}
}
