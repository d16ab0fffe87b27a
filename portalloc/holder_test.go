package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// A named holder's reservation (Request.Holder, under a lease of
// Request.TTL) belongs to no process: a CI job, a development environment.
// It outlives the process that asked, is renewed with Renew and ended with
// ReleaseHolder (or when the lease ends); its kernel lock is held by the
// holder's keeper for the lease.

func init() {
	// leaser takes a port for BERTH_TEST_HOLDER under a lease of
	// BERTH_TEST_TTL, prints it, and exits.
	workers["leaser"] = func(ctx context.Context) error {
		a, err := portalloc.New(ctx, workerConfig())
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		ttl, err := time.ParseDuration(os.Getenv("BERTH_TEST_TTL"))
		if err != nil {
			return err
		}
		r, err := a.Allocate(ctx, portalloc.Request{Label: "job", Holder: os.Getenv("BERTH_TEST_HOLDER"), TTL: ttl})
		if err != nil {
			return err
		}
		fmt.Println("port", r.Port)
		return nil
	}
}

// TestHolderOutlivesAllocator: a port taken for a holder outlives the
// process that asked; another process cannot have it; Renew extends it;
// ReleaseHolder frees it, its lock included; Renew of a holder with nothing
// is an error wrapping ErrNotFound.
func TestHolderOutlivesAllocator(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore})
	holder := testHolder(t, a)
	p := spawn(t, "leaser", "BERTH_STATE_DIR="+dir, "BERTH_TEST_HOLDER="+holder, "BERTH_TEST_TTL=1h")
	line, _ := p.out.ReadString('\n')
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("leaser: %v (said %q)", err, line)
	}
	port, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "port "))
	if err != nil {
		t.Fatalf("leaser said %q", line)
	}
	_, err = a.Reserve(ctx, portalloc.Request{}, uint16(port))
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.Holder != holder || !strings.Contains(err.Error(), "holder "+strconv.Quote(holder)) {
		t.Fatalf("Reserve(%d) of a leased port = %v; want a ConflictError naming holder %s", port, err, holder)
	}
	// Another store: only the holder's lock, kept by its keeper, stands in
	// the way.
	other := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	if _, err := other.Reserve(ctx, portalloc.Request{}, uint16(port)); !errors.Is(err, store.ErrHeld) {
		t.Errorf("Reserve(%d) of a leased port from another store = %v; want ErrHeld", port, err)
	}
	rows := storeRows(t, dir, store.Filter{Holder: holder})
	if len(rows) != 1 || rows[0].Label != "job" || rows[0].Expires.IsZero() || time.Until(rows[0].Expires) < 50*time.Minute {
		t.Errorf("rows of %s = %+v; want its one row, with its lease of an hour", holder, rows)
	}
	if n, err := a.Renew(ctx, holder, 2*time.Hour); err != nil || n != 1 {
		t.Errorf("Renew(%s) = %d, %v; want 1", holder, n, err)
	}
	if rows := storeRows(t, dir, store.Filter{Holder: holder}); len(rows) != 1 || time.Until(rows[0].Expires) < 110*time.Minute {
		t.Errorf("rows of %s after Renew = %+v; want its lease of two hours", holder, rows)
	}
	if len(a.Held()) != 0 {
		t.Errorf("Held() = %v; want none: a holder's reservation is not the Allocator's", a.Held())
	}
	if n, err := a.ReleaseHolder(ctx, holder, store.Filter{}); err != nil || n != 1 {
		t.Errorf("ReleaseHolder(%s) = %d, %v; want 1", holder, n, err)
	}
	if _, err := a.Renew(ctx, holder, time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew after release = %v; want ErrNotFound", err)
	}
	if _, err := other.Reserve(ctx, portalloc.Request{}, uint16(port)); err != nil {
		t.Errorf("Reserve(%d) from another store after the holder released it = %v; want its lock let go", port, err)
	}
}

// TestHolderReservations: a holder's ports are reserved with Allocate,
// Reserve and AllocateBlock; they are not the Allocator's (Close leaves
// them, Held lists none); ReleaseHolder takes a filter of the Allocator's
// scope; Release of one releases it for its holder.
func TestHolderReservations(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Scope: "shop"})
	dir := a.Config().StateDir
	holder := testHolder(t, a)
	lease := portalloc.Request{Holder: holder, TTL: time.Hour}
	web, api := lease, lease
	web.Label, api.Label = "web", "api"
	rw, err := a.Allocate(ctx, web)
	if err != nil || rw.Owner.Holder != holder || rw.Label != "web@shop" {
		t.Fatalf("Allocate for %s = %+v, %v; want its reservation, labelled web@shop", holder, rw, err)
	}
	port := freeRun(t, 1)
	ra, err := a.Reserve(ctx, api, port)
	if err != nil || ra.Owner.Holder != holder || ra.Port != port || ra.Kind != store.Static {
		t.Fatalf("Reserve(%d) for %s = %+v, %v", port, holder, ra, err)
	}
	block, err := a.AllocateBlock(ctx, lease, 2)
	if err != nil || len(block) != 2 || block[0].Owner.Holder != holder {
		t.Fatalf("AllocateBlock for %s = %+v, %v", holder, block, err)
	}
	if h := a.Held(); len(h) != 0 {
		t.Errorf("Held() = %v; want none", h)
	}
	// The same port for the same holder again: the lease starts over.
	if again, err := a.Reserve(ctx, api, port); err != nil || again.Port != port || again.Owner.Holder != holder {
		t.Errorf("Reserve(%d) for %s again = %+v, %v; want its reservation", port, holder, again, err)
	}
	if n, err := a.ReleaseHolder(ctx, holder, store.Filter{Label: "web"}); err != nil || n != 1 {
		t.Errorf("ReleaseHolder(%s, label web) = %d, %v; want 1: the label is of the Allocator's scope", holder, n, err)
	}
	if err := a.Release(ctx, ra); err != nil {
		t.Errorf("Release of a holder's reservation = %v", err)
	}
	if err := a.Release(ctx, ra); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release of it again = %v; want ErrNotFound", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if rows := storeRows(t, dir, store.Filter{Holder: holder}); len(rows) != 2 {
		t.Errorf("rows of %s after the Allocator's Close = %v; want the block's 2: Close leaves a holder's", holder, rows)
	}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	if n, err := b.ReleaseHolder(ctx, holder, store.Filter{}); err != nil || n != 2 {
		t.Errorf("ReleaseHolder(%s) from another Allocator = %d, %v; want 2", holder, n, err)
	}
}

// TestHolderNeedsTheStore: the MRU file keeps no holder: a holder's
// reservation is refused, never served blind, without the state store.
func TestHolderNeedsTheStore(t *testing.T) {
	ctx := context.Background()
	m := newAllocator(t, portalloc.Config{Mode: portalloc.ModeMRU})
	lease := portalloc.Request{Holder: "ci/x", TTL: time.Hour}
	if _, err := m.Allocate(ctx, lease); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a holder's Allocate in the MRU mode = %v; want ErrUnavailable", err)
	}
	if _, err := m.Reserve(ctx, lease, freeRun(t, 1)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a holder's Reserve in the MRU mode = %v; want ErrUnavailable", err)
	}
	if _, err := m.Renew(ctx, "ci/x", time.Hour); err == nil {
		t.Error("Renew in the MRU mode = nil; want an error")
	}
}

// TestHolderCallsSurviveLostStore: a holder's calls that run while the
// store's file is deleted under them, and while another call of the same
// Allocator opens it again, go on in the store opened again: none fails
// because the store it started with was closed by the repair, and a
// holder whose row was lost with the file keeps its ports by the locks its
// keeper holds (Renew counts them).
func TestHolderCallsSurviveLostStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Logger: (&logCounter{}).logger()})
	const goroutines, rounds = 4, 15
	// A short lease: the keepers of holders whose rows are lost keep
	// their locks until it ends, after the test.
	const ttl = 20 * time.Second
	holders := make([]string, goroutines)
	for g := range holders {
		holders[g] = testHolder(t, a)
		if _, err := a.Allocate(ctx, portalloc.Request{Holder: holders[g], TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		errs      []error
		renewed   int
		lostAgain int
		stop      = make(chan struct{})
	)
	for g := range goroutines {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := a.Renew(ctx, holders[g], ttl)
				if err == nil && n < 1 {
					err = fmt.Errorf("Renew(%s) = %d; want its port counted", holders[g], n)
				}
				if err == nil {
					// A port of the same holder more, and one less.
					var r store.Reservation
					if r, err = a.Allocate(ctx, portalloc.Request{Holder: holders[g], TTL: ttl, Label: "more"}); err == nil {
						err = a.Release(ctx, r)
					}
				}
				mu.Lock()
				switch {
				case err == nil:
					renewed++
				case errors.Is(err, store.ErrLost) && !errors.Is(err, store.ErrClosed):
					// Lost again each time the call opened it anew, as
					// many times as a call goes on after a loss: the
					// documented failure of a cleaner that keeps deleting.
					lostAgain++
				default:
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				mu.Unlock()
			}
		})
	}
	db := filepath.Join(dir, "berth.db")
	for range rounds {
		time.Sleep(20 * time.Millisecond)
		// Files made meanwhile can leave the directory behind
		// (ENOTEMPTY): the next round removes it.
		if err := os.RemoveAll(dir); err != nil && !errors.Is(err, syscall.ENOTEMPTY) {
			t.Error(err)
		}
		// A cleaner removes the store once, not again while it is made
		// anew: wait (a while at most) for a call to make it again.
		for wait := time.Now().Add(2 * time.Second); time.Now().Before(wait); time.Sleep(time.Millisecond) {
			if _, err := os.Stat(db); err == nil {
				break
			}
		}
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Errorf("a holder's call while the store was lost and opened again: %v", err)
	}
	if renewed == 0 {
		t.Error("no call went through: the test tested nothing")
	}
	t.Logf("%d rounds of calls went through, %d met a loss each time they opened the store anew", renewed, lostAgain)
	for _, h := range holders {
		if n, err := a.Renew(ctx, h, ttl); err != nil || n < 1 {
			t.Errorf("Renew(%s) after the losses = %d, %v; want its port, kept by its lock", h, n, err)
		}
	}
}

// TestHolderReleaseAfterLostStore: a holder's reservation whose row was
// lost with the store's file is still the holder's by its lock; Release of
// it lets the lock go, so that the port is free again at once rather than
// when the lease ends.
func TestHolderReleaseAfterLostStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Logger: (&logCounter{}).logger()})
	holder := testHolder(t, a)
	r, err := a.Allocate(ctx, portalloc.Request{Holder: holder, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	other := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	if _, err := other.Reserve(ctx, portalloc.Request{}, r.Port); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("Reserve(%d) from another store once the holder's row is lost = %v; want ErrHeld: its lock keeps it", r.Port, err)
	}
	if n, err := a.Renew(ctx, holder, time.Hour); err != nil || n != 1 {
		t.Errorf("Renew(%s) once its row is lost = %d, %v; want 1, its lock", holder, n, err)
	}
	if err := a.Release(ctx, r); err != nil {
		t.Errorf("Release of the holder's reservation once its row is lost = %v; want its lock let go", err)
	}
	if _, err := other.Reserve(ctx, portalloc.Request{}, r.Port); err != nil {
		t.Errorf("Reserve(%d) from another store after the release = %v; want it free", r.Port, err)
	}
	if err := a.Release(ctx, r); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release of it again = %v; want ErrNotFound", err)
	}
}
