package portalloc_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	migfiles "github.com/berth-go/berth/internal/migrations"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/lease"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/statestore"
)

func init() {
	// newbuild: a newer berth, whose store schema has one more migration
	// that older writers tolerate (statestore/testdata/nextschema). It
	// opens an Allocator on BERTH_STATE_DIR, allocates BERTH_TEST_N ports
	// of BERTH_TEST_RANGE and binds each ("port P", or "bindfail P" when
	// another process has it bound), says "ready", and at the end of
	// stdin closes the Allocator.
	workers["newbuild"] = func(ctx context.Context) error {
		migfiles.SetOverlay("statestore", os.DirFS(filepath.Join("..", "statestore", "testdata", "nextschema")))
		r, err := portalloc.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
		if err != nil {
			return err
		}
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: os.Getenv("BERTH_STATE_DIR"), Range: r, AllowEphemeralOverlap: true})
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(os.Getenv("BERTH_TEST_N"))
		var bound []net.Listener
		for range n {
			res, err := a.Allocate(ctx, portalloc.Request{Label: "newbuild"})
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", res.AddrPort().String())
			if err != nil {
				fmt.Println("bindfail", res.Port)
				continue
			}
			bound = append(bound, l)
			fmt.Println("port", res.Port)
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		for _, l := range bound {
			_ = l.Close()
		}
		return a.Close()
	}
	// leaser: take a port for BERTH_TEST_HOLDER under a lease of
	// BERTH_TEST_TTL, print it, and exit.
	workers["leaser"] = func(ctx context.Context) error {
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: os.Getenv("BERTH_STATE_DIR"), Range: allocRange})
		if err != nil {
			return err
		}
		defer a.Close()
		ttl, err := time.ParseDuration(os.Getenv("BERTH_TEST_TTL"))
		if err != nil {
			return err
		}
		r, err := lease.Allocate(ctx, a, portalloc.Request{Label: "job"}, lease.Lease{Holder: os.Getenv("BERTH_TEST_HOLDER"), TTL: ttl})
		if err != nil {
			return err
		}
		fmt.Println("port", r.Port)
		return nil
	}
}

// newBuildPorts reads a newbuild worker's ports up to "ready"; a port the
// kernel says another process has bound fails the test.
func newBuildPorts(tb testing.TB, p *proc) []uint16 {
	tb.Helper()
	var ports []uint16
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			tb.Fatalf("newbuild worker: %v (after %q)", err, line)
		}
		line = strings.TrimSpace(line)
		if line == "ready" {
			return ports
		}
		what, num, _ := strings.Cut(line, " ")
		port, _ := strconv.Atoi(num)
		switch what {
		case "port":
			ports = append(ports, uint16(port))
		case "bindfail":
			tb.Errorf("the newer build was granted port %d, which another process has bound", port)
		default:
			tb.Fatalf("newbuild worker said %q", line)
		}
	}
}

// allocateBound allocates n ports with a and binds each, until the test
// ends; a port the kernel says another process has bound fails the test.
func allocateBound(tb testing.TB, a *portalloc.Allocator, n int) []portalloc.Reservation {
	tb.Helper()
	var rs []portalloc.Reservation
	for range n {
		r, err := a.Allocate(context.Background(), portalloc.Request{Label: "old"})
		if err != nil {
			tb.Fatalf("Allocate: %v", err)
		}
		l, err := net.Listen("tcp", r.AddrPort().String())
		if err != nil {
			tb.Errorf("this build was granted port %d, which another process has bound: %v", r.Port, err)
			continue
		}
		tb.Cleanup(func() { _ = l.Close() })
		rs = append(rs, r)
	}
	return rs
}

// schemaVersion reads the schema version of the store in dir.
func schemaVersion(tb testing.TB, dir string) uint {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, statedir.DatabaseFile)+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	var v uint
	if err := db.QueryRow("SELECT version FROM schema_migrations").Scan(&v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// TestAllocatorSharesStoreWithNewerBuild: an Allocator of this berth and
// one of a newer berth, whose schema change older writers tolerate, share
// a store in either order: when the newer one migrates the store under the
// running older Allocator, and when the older one opens a store the newer
// one has migrated. The older Allocator never falls back, every port
// granted is bound by its holder alone (the kernel referees), no row is
// lost, and Close releases exactly the older Allocator's rows.
func TestAllocatorSharesStoreWithNewerBuild(t *testing.T) {
	rng := portalloc.Range{First: allocRange.First, Last: allocRange.First + 99}
	for _, newFirst := range []bool{false, true} {
		name := "migrated-under-running-allocator"
		if newFirst {
			name = "opens-migrated-store"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			spawnNew := func() (*proc, []uint16) {
				p := spawn(t, "newbuild", "BERTH_STATE_DIR="+dir, "BERTH_TEST_RANGE="+rng.String(), "BERTH_TEST_N=5")
				return p, newBuildPorts(t, p)
			}
			var (
				newer    *proc
				newPorts []uint16
				oldRes   []portalloc.Reservation
			)
			if newFirst {
				newer, newPorts = spawnNew()
			}
			a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: rng, AllowEphemeralOverlap: true})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			oldRes = append(oldRes, allocateBound(t, a, 5)...)
			if !newFirst {
				newer, newPorts = spawnNew()
			}
			if v := schemaVersion(t, dir); v != statestore.SchemaVersion+1 {
				t.Errorf("schema version with both running = %d; want %d, the newer build's", v, statestore.SchemaVersion+1)
			}
			oldRes = append(oldRes, allocateBound(t, a, 5)...)
			if b := a.Backend(); b != portalloc.BackendStateStore || a.FallbackCause() != nil {
				t.Errorf("older Allocator: Backend = %q, FallbackCause = %v; want %q and none", b, a.FallbackCause(), portalloc.BackendStateStore)
			}
			mine := map[uint16]bool{}
			for _, r := range oldRes {
				if r.Backend != portalloc.BackendStateStore {
					t.Errorf("reservation %v from backend %q; want %q", r, r.Backend, portalloc.BackendStateStore)
				}
				mine[r.Port] = true
			}
			for _, p := range newPorts {
				if mine[p] {
					t.Errorf("port %d granted to both builds", p)
				}
			}
			path := filepath.Join(dir, statedir.DatabaseFile)
			held, err := statestore.ReadHeld(ctx, path)
			if err != nil || held.Len() != len(oldRes)+len(newPorts) {
				t.Errorf("rows in the store = %d, %v; want %d", held.Len(), err, len(oldRes)+len(newPorts))
			}
			if err := a.Close(); err != nil {
				t.Errorf("Close of the older Allocator: %v", err)
			}
			if held, err := statestore.ReadHeld(ctx, path); err != nil || held.Len() != len(newPorts) {
				t.Errorf("rows after the older Allocator closed = %d, %v; want the newer build's %d", held.Len(), err, len(newPorts))
			}
			_ = newer.stdin.Close()
			if err := newer.cmd.Wait(); err != nil {
				t.Errorf("newbuild worker: %v", err)
			}
			if held, err := statestore.ReadHeld(ctx, path); err != nil || held.Len() != 0 {
				t.Errorf("rows after both closed = %d, %v; want 0", held.Len(), err)
			}
		})
	}
}

// TestLeaseOutlivesAllocator: a port taken for a holder outlives the
// process that asked; another process cannot have it; Renew extends it;
// ReleaseHolder frees it; Renew of a holder with nothing is an error
// wrapping ErrHolderNotFound.
func TestLeaseOutlivesAllocator(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := spawn(t, "leaser", "BERTH_STATE_DIR="+dir, "BERTH_TEST_HOLDER=ci/job-7", "BERTH_TEST_TTL=1h")
	line, _ := p.out.ReadString('\n')
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("leaser: %v (said %q)", err, line)
	}
	port, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "port "))
	if err != nil {
		t.Fatalf("leaser said %q", line)
	}
	a := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore})
	_, err = a.Reserve(ctx, portalloc.Request{}, uint16(port))
	var ce *portalloc.ConflictError
	if !errors.As(err, &ce) || !ce.Holder.Owner.IsLease() || ce.Holder.Owner.Name != "ci/job-7" {
		t.Fatalf("Reserve(%d) of a leased port = %v; want a ConflictError naming holder ci/job-7", port, err)
	}
	if n, err := lease.Renew(ctx, a, "ci/job-7", 2*time.Hour); err != nil || n != 1 {
		t.Errorf("Renew(ci/job-7) = %d, %v; want 1", n, err)
	}
	if n, err := lease.Release(ctx, a, "ci/job-7", lease.Filter{}); err != nil || n != 1 {
		t.Errorf("ReleaseHolder(ci/job-7) = %d, %v; want 1", n, err)
	}
	if _, err := lease.Renew(ctx, a, "ci/job-7", time.Hour); !errors.Is(err, lease.ErrHolderNotFound) {
		t.Errorf("Renew after release = %v; want ErrHolderNotFound", err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, uint16(port)); err != nil {
		t.Errorf("Reserve(%d) after the holder released it = %v", port, err)
	}
}

// TestLeaseRequestErrors: a lease's bad input names the field, and a lease
// is refused, never served blind, without the state store.
func TestLeaseRequestErrors(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	for _, tc := range []struct {
		l    lease.Lease
		want string
	}{
		{lease.Lease{Holder: "", TTL: time.Hour}, "holder"},
		{lease.Lease{Holder: "x", TTL: 0}, `ttl "0s": want a duration from 1s to 720h (30 days)`},
		{lease.Lease{Holder: "x", TTL: 800 * time.Hour}, `ttl "800h0m0s"`},
	} {
		_, err := lease.Allocate(ctx, a, portalloc.Request{}, tc.l)
		if !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AllocateLease(%+v) = %v; want ErrInvalidRequest mentioning %q", tc.l, err, tc.want)
		}
	}
	m := newAllocator(t, portalloc.Config{Mode: portalloc.ModeMRU})
	if _, err := lease.Allocate(ctx, m, portalloc.Request{}, lease.Lease{Holder: "x", TTL: time.Hour}); !errors.Is(err, portalloc.ErrStoreUnavailable) {
		t.Errorf("AllocateLease in the MRU mode = %v; want ErrStoreUnavailable", err)
	}
}

// TestLeaseCallsSurviveLostStore: lease calls that run while the store's
// file is deleted under them, and while another call of the same
// Allocator opens it again, go on in the store opened again: a lease
// lost with the file is not found (ErrHolderNotFound), and no call fails
// because the store it started with was closed by the repair.
func TestLeaseCallsSurviveLostStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore})
	const goroutines, rounds = 6, 30
	holder := func(g int) string { return fmt.Sprintf("ci/job-%d", g) }
	take := func(g int) error {
		_, err := lease.Allocate(ctx, a, portalloc.Request{}, lease.Lease{Holder: holder(g), TTL: time.Hour})
		return err
	}
	for g := range goroutines {
		if err := take(g); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		lost int
		stop = make(chan struct{})
	)
	for g := range goroutines {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := lease.Renew(ctx, a, holder(g), time.Hour)
				if errors.Is(err, lease.ErrHolderNotFound) {
					mu.Lock()
					lost++
					mu.Unlock()
					err = take(g) // lost with the file: lease it again
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
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
		t.Errorf("lease call while the store was lost and opened again: %v", err)
	}
	if lost == 0 {
		t.Errorf("no renewal found its lease lost in %d removals of the state directory; the test lost nothing", rounds)
	}
}
