package portalloc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// loseOnReserve is a state store whose first Reserve finds its directory
// removed: what a repair meets when a cleaner removes the state directory
// again while the repair puts the process's reservations back.
type loseOnReserve struct {
	store.Store
	path string
	lost atomic.Bool
}

func (s *loseOnReserve) Reserve(ctx context.Context, req store.Request) (store.Reservation, error) {
	if !s.lost.Swap(true) {
		if err := os.RemoveAll(filepath.Dir(s.path)); err != nil {
			return store.Reservation{}, err
		}
	}
	return s.Store.Reserve(ctx, req)
}

// TestRepairMeetsAnotherLoss: a store lost again while a repair puts the
// process's reservations back is no port another process took: none is
// counted in Stats.Lost, the call that met the first loss succeeds on the
// store opened once more, and every reservation is back in it.
func TestRepairMeetsAnotherLoss(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, databaseFile)
	var (
		opens   atomic.Int32
		reopens []*loseOnReserve
	)
	open := func(ctx context.Context) (store.Store, error) {
		s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil || opens.Add(1) != 2 {
			return s, err
		}
		l := &loseOnReserve{Store: s, path: path}
		reopens = append(reopens, l) // the repair's open: its restore meets the loss
		return l, nil
	}
	a := allocatorOn(t, dir, open, store.Range{First: 29191, Last: 29199})
	defer func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	}()
	var held []store.Reservation
	for range 3 {
		r, err := a.Allocate(ctx, Request{})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	r, err := a.Allocate(ctx, Request{})
	if err != nil {
		t.Fatalf("Allocate across two losses = %v; want a port", err)
	}
	held = append(held, r)
	if len(reopens) != 1 || !reopens[0].lost.Load() {
		t.Fatal("the repair's store was not lost: the test tested nothing")
	}
	if st := a.Stats(); st.Lost != 0 || st.Restored < 3 {
		t.Errorf("Stats() = %+v; want Lost 0 (no other process took a port), the 3 reservations restored", st)
	}
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	self, err := store.Self()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range held {
		rows, err := s.List(ctx, store.Filter{Port: h.Port})
		if err != nil || len(rows) != 1 || !rows[0].Owner.Same(self) {
			t.Errorf("rows of %s = %+v, %v; want one, this process's", h, rows, err)
		}
	}
}

// TestRepairOutOfTime: a Release whose deadline passes while it opens a
// lost store again ran out of time, and its error says so beside the loss
// (Allocate said so already, through its own check of the context).
func TestRepairOutOfTime(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, databaseFile)
	var opens atomic.Int32
	open := func(ctx context.Context) (store.Store, error) {
		if opens.Add(1) == 1 {
			return statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		}
		<-ctx.Done() // lost again and again until the call's time is up
		return nil, fmt.Errorf("open %s: the file changed while it opened: %w", path, store.ErrLost)
	}
	a := allocatorOn(t, dir, open, store.Range{First: 29181, Last: 29189})
	defer func() { _ = a.Close() }()
	r, err := a.Allocate(ctx, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = a.Release(tctx, r)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, store.ErrLost) {
		t.Errorf("Release whose time ran out reopening a lost store = %v; want it to wrap context.DeadlineExceeded and store.ErrLost", err)
	}
}

// allocatorOn is an Allocator of the state store in dir on r, whose store
// open opens (again after a loss).
func allocatorOn(t *testing.T, dir string, open func(context.Context) (store.Store, error), r store.Range) *Allocator {
	t.Helper()
	cfg, err := Config{StateDir: dir, Mode: ModeStateStore, Range: r, AllowEphemeralOverlap: true, IgnoreEnv: true}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	a, err := prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, databaseFile)
	m := mru.New(filepath.Join(t.TempDir(), mruFile), mru.Options{})
	a.h, err = share(context.Background(), "test "+path, path, open, true, m, a, logr.Discard(), logr.Discard(), func(error) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	return a
}
