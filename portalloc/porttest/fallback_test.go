package porttest_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/porttest"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/statestore"
)

// logRecorder is a testing.TB that also keeps what is logged through it.
type logRecorder struct {
	testing.TB
	mu   sync.Mutex
	logs []string
}

func (r *logRecorder) Logf(format string, args ...any) {
	r.TB.Helper()
	r.mu.Lock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
	r.mu.Unlock()
	r.TB.Logf(format, args...)
}

func (r *logRecorder) Helper() {}

func (r *logRecorder) logged(phrase string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.logs {
		if strings.Contains(l, phrase) {
			return true
		}
	}
	return false
}

// TestFallbackIsLogged: when the state store cannot be used, a test that
// gets a port from the MRU file is told so through its log, once, with the
// cause.
func TestFallbackIsLogged(t *testing.T) {
	dir := t.TempDir()
	// A store a newer berth changed so that older berths may not write to
	// it (a newer write version): this one can read it, not write to it.
	path := filepath.Join(dir, statedir.DatabaseFile)
	s, err := statestore.Open(context.Background(), path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(fmt.Sprintf("UPDATE schema_migrations SET version = %d; PRAGMA user_version = %d", statestore.SchemaVersion+1, statestore.WriteVersion+1))
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	t.Setenv(portalloc.EnvStateDir, dir)
	t.Setenv(portalloc.EnvMode, string(portalloc.ModeStateStoreWithFallback))
	var rec *logRecorder
	t.Run("inner", func(t *testing.T) {
		rec = &logRecorder{TB: t}
		porttest.Ports(rec, 2)
		porttest.Port(rec)
	})
	if !rec.logged("comes from berth's MRU file") || !rec.logged("schema version") {
		t.Fatalf("the test's log = %q; want the fallback to the MRU file, with its cause", rec.logs)
	}
	n := 0
	for _, l := range rec.logs {
		if strings.HasPrefix(l, "porttest:") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the fallback was logged %d times in one test; want once: %q", n, rec.logs)
	}
}

// TestFleetStoreIgnored: a BERTH_STORE set for a fleet's programs does not
// break a package's tests: porttest keeps its ports in this host's store,
// and says so in the test's log.
func TestFleetStoreIgnored(t *testing.T) {
	t.Setenv(portalloc.EnvStateDir, t.TempDir())
	t.Setenv(portalloc.EnvStore, "postgres://berth:Sekr3t@db.example/berth")
	var rec *logRecorder
	t.Run("inner", func(t *testing.T) {
		rec = &logRecorder{TB: t}
		if p := porttest.Port(rec); p == 0 {
			t.Fatal("Port = 0")
		}
	})
	if !rec.logged(portalloc.EnvStore+" is set") || rec.logged("Sekr3t") {
		t.Fatalf("the test's log = %q; want a note that BERTH_STORE is set, without its password", rec.logs)
	}
}
