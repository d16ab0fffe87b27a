package statestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
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
			if _, err := store.Self(); err != nil {
				return err
			}
		}
		if err := testproc.LeaveSpareFDs(spare); err != nil {
			return err
		}
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err == nil {
			_, err = s.List(ctx, store.Filter{})
			_ = s.Close()
		}
		if err != nil {
			return out.Encode(starvedEvent{Error: err.Error(), Transient: errors.Is(err, store.ErrTransient), Storage: errors.Is(err, store.ErrStorage)})
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
