package portalloc

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// loseOnReserve is a state store whose first Reserve finds its directory
// removed: what a repair meets when a cleaner removes the state directory
// again while the repair puts the Allocator's reservations back.
type loseOnReserve struct {
	*statestore.Store
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
// Allocator's reservations back is no port another process took: none is
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
	open := func(ctx context.Context, _ Config, _ bool) (store.Store, error) {
		s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil || opens.Add(1) != 2 {
			return s, err
		}
		l := &loseOnReserve{Store: s, path: path}
		reopens = append(reopens, l) // the repair's open: its restore meets the loss
		return l, nil
	}
	a, err := newAllocator(ctx, Config{StateDir: dir, StoreDSN: "postgres://berth.test/berth", Range: Range{First: 24191, Last: 24199}}, open, nil, "New")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	}()
	var held []Reservation
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
	if st := a.Stats(); st.Lost != 0 {
		t.Errorf("Stats().Lost = %d; want 0: no other process took a port", st.Lost)
	}
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	self, err := statestore.Self()
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
