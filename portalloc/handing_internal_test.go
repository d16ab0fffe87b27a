package portalloc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// loseOnTransfer is a state store whose first Transfer finds its file lost,
// after a store made anew at the same path took in the row as the new
// owner's (from the mark Transfer makes for it before it writes): what
// happens when the directory is removed while a Transfer runs.
type loseOnTransfer struct {
	*statestore.Store
	path string
	lost bool
	made *statestore.Store // the store made anew, closed by the test
}

func (s *loseOnTransfer) Transfer(ctx context.Context, key store.Key, from, to store.Owner) error {
	if s.lost {
		return s.Store.Transfer(ctx, key, from, to)
	}
	s.lost = true
	if err := os.RemoveAll(filepath.Dir(s.path)); err != nil {
		return err
	}
	made, err := statestore.Open(ctx, s.path, statestore.Options{SweepInterval: -1})
	if err != nil {
		return err
	}
	s.made = made
	// The new store holds the row as this process's (its mark); hand it
	// on as the lost store's Transfer was doing when the file went.
	if err := made.Transfer(ctx, key, store.Owner{}, to); err != nil {
		return err
	}
	return fmt.Errorf("transfer %s: database file %s is gone: %w", key, s.path, store.ErrLost)
}

// TestTransferAcrossALostStore: a Transfer whose store is lost while it
// runs, and whose row a store made anew took in as the new owner's, ends
// with the row the new owner's; the repair does not count it as a port
// another process took.
func TestTransferAcrossALostStore(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, databaseFile)
	var first *loseOnTransfer
	open := func(ctx context.Context, _ Config, _ bool) (store.Store, error) {
		s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
		if err != nil || first != nil {
			return s, err
		}
		first = &loseOnTransfer{Store: s, path: path}
		return first, nil
	}
	a, err := newAllocator(ctx, Config{StateDir: dir, StoreDSN: "postgres://berth.test/berth", Range: Range{First: 24181, Last: 24189}}, open, nil, "New")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		if first != nil && first.made != nil {
			_ = first.made.Close()
		}
	}()
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Skipf("skipping: cannot start a child: %v", err)
	}
	defer func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	}()

	r, err := a.Allocate(ctx, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Transfer(ctx, r, child.Process.Pid); err != nil {
		t.Fatalf("Transfer across a lost store = %v; want nil: the row is the child's in the store made anew", err)
	}
	if !first.lost {
		t.Fatal("the store was not lost: the test tested nothing")
	}
	if st := a.Stats(); st.Lost != 0 {
		t.Errorf("Stats().Lost = %d; want 0: the row the repair met was the one being handed over", st.Lost)
	}
	for _, h := range a.Held() {
		if h.Port == r.Port {
			t.Errorf("the Allocator still holds %s after handing it over", h)
		}
	}
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.List(ctx, store.Filter{Port: r.Port})
	if err != nil || len(rows) != 1 || rows[0].Owner.PID != child.Process.Pid {
		t.Errorf("rows of port %d = %+v, %v; want one, the child's (pid %d)", r.Port, rows, err, child.Process.Pid)
	}
}
