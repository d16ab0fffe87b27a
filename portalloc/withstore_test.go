package portalloc_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestNewRefusesStoreWithoutFleet: portalloc links no PostgreSQL client,
// so New refuses a Config.StoreDSN with a *FieldError that says which package
// opens it, its password hidden; nothing is opened, not even the SQLite
// store in its place.
func TestNewRefusesStoreWithoutFleet(t *testing.T) {
	const pw = "Sekr3t-PW-9f2"
	dir := t.TempDir()
	cfg := portalloc.Config{StoreDSN: "postgres://berth:" + pw + "@db.example/berth", StateDir: dir, Range: allocRange}
	_, errNew := portalloc.New(context.Background(), cfg)
	for name, err := range map[string]error{"New": errNew} {
		var fe *portalloc.FieldError
		if !errors.As(err, &fe) || fe.Field != "Config.StoreDSN" || !errors.Is(err, portalloc.ErrInvalidRequest) ||
			!strings.Contains(err.Error(), `"github.com/berth-go/berth/portalloc/fleet"`) || !strings.Contains(err.Error(), "fleet."+name) || strings.Contains(err.Error(), pw) {
			t.Errorf("%s with a Config.StoreDSN = %v; want a *FieldError for Config.StoreDSN naming package portalloc/fleet and fleet.%s, the password hidden", name, err, name)
		}
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "*")); len(matches) != 0 {
		t.Errorf("New refused the Store but made %v", matches)
	}
	// With the opener, the same Config reaches the server (here none).
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	if _, err := fleet.New(ctx, cfg); errors.Is(err, portalloc.ErrInvalidRequest) {
		t.Errorf("fleet.New with a Config.StoreDSN = %v; want it to try the store, not refuse the Config", err)
	}
}

// TestNewWithStore: an Allocator given an open store reserves in it, never
// falls back, and closes it with itself.
func TestNewWithStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "own.db")
	s, err := statestore.Open(ctx, path, statestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: t.TempDir(), Range: allocRange}, s)
	if err != nil {
		s.Close()
		t.Fatalf("NewWithStore = %v", err)
	}
	r, err := a.Allocate(ctx, portalloc.Request{Label: "given"})
	if err != nil {
		t.Fatalf("Allocate = %v", err)
	}
	if r.Backend != portalloc.BackendStateStore || a.Config().Mode != portalloc.ModeStateStore {
		t.Errorf("Allocate on a given store = %+v in mode %q; want the store's, mode statestore (no fallback)", r, a.Config().Mode)
	}
	rows, err := s.List(ctx, store.Filter{Label: "given"})
	if err != nil || len(rows) != 1 || rows[0].Port != r.Port {
		t.Errorf("the given store's rows = %+v, %v; want the one of port %d", rows, err, r.Port)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if _, err := s.List(ctx, store.Filter{}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("List on the given store after the Allocator's Close = %v; want ErrClosed: the Allocator owns it", err)
	}

	// A store it cannot use as asked is refused, and stays the caller's.
	var fe *portalloc.FieldError
	if _, err := portalloc.NewWithStore(ctx, portalloc.Config{}, nil); !errors.As(err, &fe) {
		t.Errorf("NewWithStore(nil) = %v; want a *FieldError", err)
	}
	s2, err := statestore.Open(ctx, filepath.Join(t.TempDir(), "mru.db"), statestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := portalloc.NewWithStore(ctx, portalloc.Config{Mode: portalloc.ModeMRU}, s2); !errors.As(err, &fe) || fe.Field != "Config.Mode" {
		t.Errorf("NewWithStore in ModeMRU = %v; want a *FieldError for Config.Mode", err)
	}
	if _, err := s2.List(ctx, store.Filter{}); err != nil {
		t.Errorf("a store NewWithStore refused was closed: List = %v", err)
	}
}

// TestFleetCallsNeedAFleetStore: the fleet-wide calls use the store as a
// store.FleetStore; a given SQLite store is none, and they say so.
func TestFleetCallsNeedAFleetStore(t *testing.T) {
	ctx := context.Background()
	s, err := statestore.Open(ctx, filepath.Join(t.TempDir(), "one.db"), statestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := any(s).(store.FleetStore); ok {
		t.Fatal("statestore.Store is a store.FleetStore; the test needs a store of one host")
	}
	a, err := portalloc.NewWithStore(ctx, portalloc.Config{Range: allocRange, StateDir: t.TempDir()}, s)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	defer a.Close()
	_, err = fleet.Reserve(ctx, a, fleet.FleetRequest{Protocol: portalloc.TCP, Band: fleet.Band{First: 40000, Last: 40009}, Holder: "pod/x"})
	var fe *portalloc.FieldError
	if !errors.As(err, &fe) || fe.Field != "Config.StoreDSN" {
		t.Errorf("ReserveFleet on a given SQLite store = %v; want a *FieldError for Config.StoreDSN", err)
	}
}
