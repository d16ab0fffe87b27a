package portalloc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestNewRefusesStoreWithoutFleet: portalloc links no PostgreSQL client,
// so New refuses a StoreDSN with a *store.FieldError that says which
// package opens it, its password hidden, named by the field or the
// variable it came from; nothing is opened, not even the SQLite store in
// its place.
func TestNewRefusesStoreWithoutFleet(t *testing.T) {
	unsetBerthEnv(t)
	const pw = "Sekr3t-PW-9f2"
	dsn := "postgres://berth:" + pw + "@db.example/berth"
	dir := t.TempDir()
	cfg := portalloc.Config{StoreDSN: dsn, StateDir: dir, Range: allocRange}
	_, err := portalloc.New(context.Background(), cfg)
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "Config.StoreDSN" || !errors.Is(err, store.ErrInvalid) ||
		!strings.Contains(err.Error(), `"github.com/berth-go/berth/portalloc/fleet"`) || !strings.Contains(err.Error(), "fleet.New") || strings.Contains(err.Error(), pw) {
		t.Errorf("New with a Config.StoreDSN = %v; want a *FieldError for Config.StoreDSN naming package portalloc/fleet and fleet.New, the password hidden", err)
	}
	t.Setenv("BERTH_STORE", dsn)
	_, err = portalloc.New(context.Background(), portalloc.Config{StateDir: dir, Range: allocRange})
	if !errors.As(err, &fe) || fe.Field != "BERTH_STORE" || strings.Contains(err.Error(), pw) {
		t.Errorf("New with BERTH_STORE set = %v; want a *FieldError for BERTH_STORE, the password hidden", err)
	}
	if a, err := portalloc.New(context.Background(), portalloc.Config{StateDir: dir, Range: allocRange, IgnoreEnv: true, Mode: portalloc.ModeStateStore}); err != nil {
		t.Errorf("New with BERTH_STORE set and IgnoreEnv = %v; want the SQLite store", err)
	} else {
		if matches, _ := filepath.Glob(filepath.Join(dir, "berth.db")); len(matches) != 1 {
			t.Errorf("New with IgnoreEnv made no store in %s", dir)
		}
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BERTH_STORE", "")
	if _, err := portalloc.New(context.Background(), cfg); err == nil {
		t.Fatal("New with a StoreDSN = nil")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New refused the StoreDSN but made %s (%v)", dir, err)
	}
	// With the opener, the same Config reaches for the server (here none).
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	if _, err := fleet.New(ctx, cfg); err == nil || errors.Is(err, store.ErrInvalid) {
		t.Errorf("fleet.New with a Config.StoreDSN = %v; want it to try the store, not refuse the Config", err)
	}
}

// TestNewWithStore: an Allocator given a store by its opener reserves in
// it, never falls back, and closes it with itself; an opener that fails
// fails NewWithStore.
func TestNewWithStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "own.db")
	var opened store.Store
	open := func(ctx context.Context, cfg portalloc.Config) (store.Store, error) {
		if cfg.Mode != portalloc.ModeStateStore || cfg.Range != allocRange {
			t.Errorf("the opener was given %+v; want the completed Config, mode statestore", cfg)
		}
		s, err := statestore.Open(ctx, path, statestore.Options{})
		opened = s
		return s, err
	}
	a, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: t.TempDir(), Range: allocRange, IgnoreEnv: true}, open)
	if err != nil {
		t.Fatalf("NewWithStore = %v", err)
	}
	r, err := a.Allocate(ctx, portalloc.Request{Label: "given"})
	if err != nil {
		t.Fatalf("Allocate = %v", err)
	}
	if a.Config().Mode != portalloc.ModeStateStore {
		t.Errorf("Allocator of a given store in mode %q; want statestore (no fallback)", a.Config().Mode)
	}
	rows, err := opened.List(ctx, store.Filter{Label: "given"})
	if err != nil || len(rows) != 1 || rows[0].Port != r.Port {
		t.Errorf("the given store's rows = %+v, %v; want the one of port %d", rows, err, r.Port)
	}
	// Each NewWithStore without a StoreDSN opens a store of its own.
	var second store.Store
	b, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: t.TempDir(), Range: allocRange, IgnoreEnv: true}, func(ctx context.Context, _ portalloc.Config) (store.Store, error) {
		s, err := statestore.Open(ctx, filepath.Join(t.TempDir(), "second.db"), statestore.Options{})
		second = s
		return s, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if second == nil || second == opened {
		t.Error("a second NewWithStore did not open its own store")
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if _, err := opened.List(ctx, store.Filter{}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("List on the given store after the Allocator's Close = %v; want ErrClosed: the Allocator owns it", err)
	}
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rows, err := s.List(ctx, store.Filter{}); err != nil || len(rows) != 0 {
		t.Errorf("rows of the given store after Close = %v, %v; want none: Close released them", rows, err)
	}

	// An opener's error is NewWithStore's, wrapping ErrUnavailable.
	boom := errors.New("no such store")
	if _, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: t.TempDir(), IgnoreEnv: true}, func(context.Context, portalloc.Config) (store.Store, error) {
		return nil, boom
	}); !errors.Is(err, boom) || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("NewWithStore with an opener that fails = %v; want its error, wrapping ErrUnavailable", err)
	}
	// A Config it refuses never calls the opener.
	called := false
	if _, err := portalloc.NewWithStore(ctx, portalloc.Config{Mode: portalloc.ModeMRU, IgnoreEnv: true}, func(context.Context, portalloc.Config) (store.Store, error) {
		called = true
		return nil, boom
	}); err == nil || called {
		t.Errorf("NewWithStore in ModeMRU = %v (opener called: %v); want a refusal before opening", err, called)
	}
}

// TestNewWithStoreLostFile: a store given to NewWithStore whose file is
// lost is not opened again: calls fail saying so, until the program makes
// a new Allocator.
func TestNewWithStoreLostFile(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	log := &logCounter{}
	open := func(ctx context.Context, _ portalloc.Config) (store.Store, error) {
		return statestore.Open(ctx, filepath.Join(dir, "berth.db"), statestore.Options{})
	}
	a, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: t.TempDir(), Range: allocRange, IgnoreEnv: true, Logger: log.logger()}, open)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close() }()
	if _, err := a.Allocate(ctx, portalloc.Request{}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, store.ErrLost) {
		t.Errorf("Allocate after the given store's file was lost = %v; want ErrUnavailable wrapping ErrLost", err)
	}
	b, err := portalloc.NewWithStore(ctx, portalloc.Config{StateDir: t.TempDir(), Range: allocRange, IgnoreEnv: true, Logger: log.logger()}, open)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	if _, err := b.Allocate(ctx, portalloc.Request{}); err != nil {
		t.Errorf("Allocate of a new Allocator on the store made anew = %v", err)
	}
}
