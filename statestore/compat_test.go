package statestore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	migfiles "github.com/berth-go/berth/internal/migrations"
	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// A "build" of berth in these tests is the test binary with or without a
// test-only migration 7 on top of berth's own (BERTH_TEST_SCHEMA names the
// directory under testdata that holds it): "" is this berth, nextschema a
// newer one whose change older writers tolerate (a table, a column with a
// default, an index; write version unchanged), breakingschema a newer one
// whose change they do not (write version + 1).
const envSchema = "BERTH_TEST_SCHEMA"

func useSchema(name string) {
	if name != "" {
		migfiles.SetOverlay("statestore", os.DirFS(filepath.Join("testdata", name)))
	}
}

func init() {
	// compat: a build of the schema BERTH_TEST_SCHEMA names opens the
	// store, reports its error or "opened", then obeys lines on stdin:
	// "scan N" reserves N ports of BERTH_TEST_LO to BERTH_TEST_HI with a
	// bind probe and keeps each bound (a "grant" each, or "bindfail" when
	// the kernel says another process has it, which is a double grant),
	// then "done". At the end of stdin it releases its rows ("released",
	// Port the count) and closes the store.
	extraWorkers["compat"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		useSchema(os.Getenv(envSchema))
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return out.Encode(event{Event: "error", Error: err.Error()})
		}
		_ = out.Encode(event{Event: "opened"})
		lo, _ := strconv.Atoi(os.Getenv("BERTH_TEST_LO"))
		hi, _ := strconv.Atoi(os.Getenv("BERTH_TEST_HI"))
		var bound []net.Listener
		defer func() {
			for _, l := range bound {
				_ = l.Close()
			}
		}()
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			n, ok := strings.CutPrefix(in.Text(), "scan ")
			if !ok {
				return fmt.Errorf("unknown command %q", in.Text())
			}
			count, _ := strconv.Atoi(n)
			for range count {
				port := uint16(lo)
				r, err := s.Scan(ctx, store.ScanRequest{
					Protocol: store.TCP,
					Addr:     loopback,
					Next: func() (uint16, bool) {
						p := port
						port++
						return p, int(p) <= hi
					},
					Probe: bindProbe,
				})
				if err != nil {
					_ = out.Encode(event{Event: "error", Error: err.Error()})
					continue
				}
				l, err := net.Listen("tcp", netip.AddrPortFrom(r.Addr, r.Port).String())
				if err != nil {
					_ = out.Encode(event{Event: "bindfail", Port: r.Port, Error: err.Error()})
					continue
				}
				bound = append(bound, l)
				_ = out.Encode(event{Event: "grant", Port: r.Port})
			}
			_ = out.Encode(event{Event: "done"})
		}
		mine, err := s.List(ctx, store.Filter{OwnerPID: os.Getpid()})
		if err != nil {
			return err
		}
		for _, r := range mine {
			if err := s.Release(ctx, r.Key, store.Owner{}); err != nil {
				return err
			}
		}
		_ = out.Encode(event{Event: "released", Port: uint16(len(mine))})
		return s.Close()
	}
}

var loopback = netip.MustParseAddr("127.0.0.1")

// bindProbe refuses a port that cannot be bound on its address right now,
// as portalloc's probe does.
func bindProbe(k store.Key) error {
	free, err := portlock.Probe(string(k.Protocol), k.Addr, k.Port)
	if err != nil {
		return err
	}
	if !free {
		return bound(k)
	}
	return nil
}

// TestWriteVersionsDeclared: every migration of this berth from the first
// that declares write versions on declares one by the rule, and the last
// one's is WriteVersion.
func TestWriteVersionsDeclared(t *testing.T) {
	writes, err := migfiles.WriteVersions(os.DirFS("."), "migrations")
	if err != nil {
		t.Fatal(err)
	}
	if got := writes[statestore.SchemaVersion]; got != statestore.WriteVersion || got < 1 {
		t.Errorf("write version of migration %d = %d; WriteVersion = %d; want them equal and at least 1", statestore.SchemaVersion, got, statestore.WriteVersion)
	}
	for _, dir := range []string{"testdata/nextschema", "testdata/breakingschema"} {
		if _, err := migfiles.WriteVersions(os.DirFS(dir), "migrations"); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
}

// compatWorker is a worker of one build on the store at db.
type compatWorker struct {
	*worker
	build string
}

func startCompat(tb testing.TB, db, build string) *compatWorker {
	tb.Helper()
	r := testports.Statestore
	w := startWorker(tb, "compat", db, envSchema+"="+build,
		fmt.Sprintf("BERTH_TEST_LO=%d", r.First), fmt.Sprintf("BERTH_TEST_HI=%d", r.Last))
	if e := w.next(tb); e.Event != "opened" {
		tb.Fatalf("build %q: Open = %s %s; want it opened", build, e.Event, e.Error)
	}
	return &compatWorker{worker: w, build: build}
}

// scan asks for n ports and returns those granted; it fails the test on a
// port granted but bound by another process, and on any error.
func (w *compatWorker) scan(tb testing.TB, n int) []uint16 {
	tb.Helper()
	if _, err := fmt.Fprintf(w.stdin, "scan %d\n", n); err != nil {
		tb.Fatal(err)
	}
	var got []uint16
	for _, e := range w.until(tb, "done") {
		switch e.Event {
		case "grant":
			got = append(got, e.Port)
		case "bindfail":
			tb.Errorf("build %q was granted port %d, which another process has bound: %s", w.build, e.Port, e.Error)
		}
	}
	if len(got) != n {
		tb.Errorf("build %q got %d ports; want %d", w.build, len(got), n)
	}
	return got
}

// finish ends the worker and returns how many rows it released.
func (w *compatWorker) finish(tb testing.TB) int {
	tb.Helper()
	_ = w.stdin.Close()
	e := w.until(tb, "released")
	return int(e[len(e)-1].Port)
}

func schemaOf(tb testing.TB, path string) (version, write uint) {
	tb.Helper()
	db := migrationsDB(tb, path)
	if err := db.QueryRow("SELECT version FROM schema_migrations").Scan(&version); err != nil {
		tb.Fatal(err)
	}
	if err := db.QueryRow("PRAGMA user_version").Scan(&write); err != nil {
		tb.Fatal(err)
	}
	return version, write
}

// TestBuildsShareStore: a build of this berth and a newer build whose
// schema change older writers tolerate work on one store at once, in
// either order of opening: the older one writes on with its full
// guarantee after the newer one migrated the store under it (every port
// granted is bound by its holder alone: the kernel referees), no row is
// lost, and each releases its own rows when it ends.
func TestBuildsShareStore(t *testing.T) {
	testports.Hold(t, testports.Statestore)
	for _, order := range [][2]string{{"", "nextschema"}, {"nextschema", ""}} {
		name := "old-first"
		if order[0] != "" {
			name = "new-first"
		}
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "berth.db")
			first := startCompat(t, path, order[0])
			a := first.scan(t, 4)
			second := startCompat(t, path, order[1])
			if v, w := schemaOf(t, path); v != statestore.SchemaVersion+1 || w != statestore.WriteVersion {
				t.Errorf("store after both opened: schema %d write %d; want %d and %d", v, w, statestore.SchemaVersion+1, statestore.WriteVersion)
			}
			b := second.scan(t, 4)
			a = append(a, first.scan(t, 4)...) // the first one goes on after the second opened
			b = append(b, second.scan(t, 4)...)
			seen := map[uint16]string{}
			for _, p := range a {
				seen[p] = "first"
			}
			for _, p := range b {
				if seen[p] != "" {
					t.Errorf("port %d granted to both builds", p)
				}
			}
			s := openAt(t, path)
			if rows := list(t, s); len(rows) != len(a)+len(b) {
				t.Errorf("%d rows in the store; want %d (%d and %d granted)", len(rows), len(a)+len(b), len(a), len(b))
			}
			if n := first.finish(t); n != len(a) {
				t.Errorf("build %q released %d rows; want %d", order[0], n, len(a))
			}
			if n := second.finish(t); n != len(b) {
				t.Errorf("build %q released %d rows; want %d", order[1], n, len(b))
			}
			if rows := list(t, s); len(rows) != 0 {
				t.Errorf("rows left after both released: %+v", rows)
			}
		})
	}
}

// TestBreakingSchemaRefused: a newer build whose change older writers do
// not tolerate takes the next write version; this build then refuses the
// store with ErrSchemaTooNew, and leaves it as it is.
func TestBreakingSchemaRefused(t *testing.T) {
	testports.Hold(t, testports.Statestore)
	path := filepath.Join(t.TempDir(), "berth.db")
	newer := startCompat(t, path, "breakingschema")
	newer.scan(t, 1)
	if v, w := schemaOf(t, path); v != statestore.SchemaVersion+1 || w != statestore.WriteVersion+1 {
		t.Fatalf("store after the breaking build opened it: schema %d write %d; want %d and %d", v, w, statestore.SchemaVersion+1, statestore.WriteVersion+1)
	}
	_, err := statestore.Open(context.Background(), path, statestore.Options{SweepInterval: -1})
	if !errors.Is(err, store.ErrSchemaTooNew) {
		t.Errorf("Open of a store of write version %d = %v; want ErrSchemaTooNew", statestore.WriteVersion+1, err)
	}
	if n := newer.finish(t); n != 1 {
		t.Errorf("the breaking build released %d rows; want 1", n)
	}
}

// TestNewerSchemaInProcess: a store of a newer schema of a known write
// version, with a table and a column this berth does not know, opens
// without a migration and takes reservations.
func TestNewerSchemaInProcess(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s := openAt(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	up, err := os.ReadFile("testdata/nextschema/migrations/7_next.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	db := migrationsDB(t, path)
	if _, err := db.Exec(string(up) + "; UPDATE schema_migrations SET version = 7"); err != nil {
		t.Fatal(err)
	}
	s, err = statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatalf("Open of a newer schema of a known write version = %v", err)
	}
	defer s.Close()
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, 26390), Label: "new"}); err != nil {
		t.Fatalf("Reserve on a newer schema = %v", err)
	}
	var note string
	if err := db.QueryRow("SELECT note FROM port_allocations WHERE port = 26390").Scan(&note); err != nil || note != "" {
		t.Errorf("note of the row this berth wrote = %q, %v; want the default", note, err)
	}
	if v, _ := schemaOf(t, path); v != 7 {
		t.Errorf("schema version after Open = %d; want 7 left as it was", v)
	}
}
