//go:build linux

package portalloc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// lockHolders returns the processes that hold a lock of tcp port.
func lockHolders(t *testing.T, port uint16) []int {
	t.Helper()
	held, err := portlock.List()
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, h := range held {
		if h.Network == "tcp" && h.Port == port {
			pids = append(pids, h.PIDs...)
		}
	}
	return pids
}

// waitGranted reserves tcp lo4:port in a until it is granted, for at most
// five seconds (a keeper lets go once it sees its owner exit).
func waitGranted(t *testing.T, a *portalloc.Allocator, port uint16) store.Reservation {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var r store.Reservation
		if r, err = a.Reserve(context.Background(), portalloc.Request{Addr: lo4}, port); !errors.Is(err, store.ErrHeld) {
			if err != nil {
				t.Fatalf("Reserve(%d) = %v", port, err)
			}
			return r
		}
	}
	t.Fatalf("Reserve(%d) still refused after 5s: %v", port, err)
	return store.Reservation{}
}

// TestLockDiesWithHolder: the lock of a child handed a port, and of a
// program that exec'd with it (berth run), is the holder's own: killed, it
// frees the port at once for every berth, whatever its store, with no
// keeper or reaping in between.
func TestLockDiesWithHolder(t *testing.T) {
	for _, kind := range []string{ownChild, ownExec, ownLibrary} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			port := freeRun(t, 1)
			o := makeOwner(t, dir, kind, lo4, port)
			// The exec owner says it is ready just before it execs: while
			// the kernel swaps its image, /proc shows no descriptors.
			holders := lockHolders(t, port)
			for deadline := time.Now().Add(5 * time.Second); len(holders) == 0 && time.Now().Before(deadline); holders = lockHolders(t, port) {
				time.Sleep(10 * time.Millisecond)
			}
			if !slices.Contains(holders, o.pid) || len(holders) != 1 {
				t.Fatalf("lock of %d held by %v; want only the owner, pid %d (no keeper)", port, holders, o.pid)
			}
			// Another store: only the lock stands in the way.
			other := newAllocator(t, portalloc.Config{StateDir: t.TempDir(), Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
			if _, err := other.Reserve(context.Background(), portalloc.Request{Addr: lo4}, port); !errors.Is(err, store.ErrHeld) {
				t.Fatalf("Reserve(%d) from another store while the %s owner lives = %v; want ErrHeld", port, kind, err)
			}
			if err := syscall.Kill(o.pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if kind != ownChild {
				_ = o.worker.cmd.Wait()
			}
			o.pid = 0
			waitGranted(t, other, port)
		})
	}
}

// TestKeeper: a process that runs no berth code (here sleep(1)) handed a
// port has a keeper hold its lock, which lets go when that process exits.
// A keeper killed takes the lock with it, as the docs say: the owner's row
// still keeps the port from every berth of that store, and nothing keeps
// it from a berth of another store or a test helper (the one case the
// guarantee of a lock does not cover).
func TestKeeper(t *testing.T) {
	dir := t.TempDir()
	port := freeRun(t, 1)
	o := makeOwner(t, dir, ownShell, lo4, port)
	holders := lockHolders(t, port)
	if len(holders) != 1 || holders[0] == o.pid {
		t.Fatalf("lock of %d held by %v; want one keeper, not the owner (pid %d)", port, holders, o.pid)
	}
	keeper := holders[0]
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(keeper) + "/cmdline"); err != nil || string(b) != "berth-keeper\x00pid\x00"+strconv.Itoa(o.pid)+"\x00" {
		t.Errorf("keeper pid %d's command line = %q, %v; want berth-keeper pid %d", keeper, b, err, o.pid)
	}

	same := newAllocator(t, portalloc.Config{StateDir: dir, Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
	other := newAllocator(t, portalloc.Config{StateDir: t.TempDir(), Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
	for _, a := range []*portalloc.Allocator{same, other} {
		if _, err := a.Reserve(context.Background(), portalloc.Request{Addr: lo4}, port); !errors.Is(err, store.ErrHeld) {
			t.Fatalf("Reserve(%d) while the keeper holds it = %v; want ErrHeld", port, err)
		}
	}

	if err := syscall.Kill(keeper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(lockHolders(t, port)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lock of %d still held by %v after its keeper was killed", port, lockHolders(t, port))
		}
	}
	_, err := same.Reserve(context.Background(), portalloc.Request{Addr: lo4}, port)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != o.pid {
		t.Fatalf("Reserve(%d) from the owner's store once its keeper is killed = %v; want a conflict with pid %d's row", port, err, o.pid)
	}
	r := waitGranted(t, other, port)
	if err := other.Release(context.Background(), r); err != nil {
		t.Fatal(err)
	}

	// The owner's exit ends its row too.
	if err := syscall.Kill(o.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	o.pid = 0
	waitGranted(t, same, port)
}

// TestHolderKeeperLease: a named holder's lock is kept for the lease and
// let go when it ends, with no process of the holder's alive; Renew keeps
// it longer.
func TestHolderKeeperLease(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	port := freeRun(t, 1)
	holder := "test/lease/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	a := newAllocator(t, portalloc.Config{StateDir: dir, Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
	if _, err := a.Reserve(ctx, portalloc.Request{Addr: lo4, Holder: holder, TTL: 2 * time.Second}, port); err != nil {
		t.Fatal(err)
	}
	other := newAllocator(t, portalloc.Config{StateDir: filepath.Join(t.TempDir(), "other"), Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
	if _, err := other.Reserve(ctx, portalloc.Request{Addr: lo4}, port); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("Reserve(%d) from another store during the lease = %v; want ErrHeld", port, err)
	}
	time.Sleep(time.Second)
	if n, err := a.Renew(ctx, holder, 3*time.Second); err != nil || n != 1 {
		t.Fatalf("Renew = %d, %v; want 1", n, err)
	}
	time.Sleep(1500 * time.Millisecond) // past the first lease, within the renewed one
	if _, err := other.Reserve(ctx, portalloc.Request{Addr: lo4}, port); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("Reserve(%d) from another store after a renewal = %v; want ErrHeld", port, err)
	}
	r := waitGranted(t, other, port) // the renewed lease ends within 1.5s
	if err := other.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Renew(ctx, holder, time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew once the lease ended = %d, %v; want ErrNotFound: an ended lease is never revived", n, err)
	}
}

// TestTransferToSelf: a reservation handed to this very process is its
// own past its Allocator: Close leaves it, and its lock keeps the port
// from every berth until the process exits.
func TestTransferToSelf(t *testing.T) {
	ctx := context.Background()
	port := freeRun(t, 1)
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: t.TempDir(), Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true, IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.Reserve(ctx, portalloc.Request{Addr: lo4}, port)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Transfer(ctx, r, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	other := newAllocator(t, portalloc.Config{StateDir: t.TempDir(), Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
	if _, err := other.Reserve(ctx, portalloc.Request{Addr: lo4}, port); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("Reserve(%d) from another store after it was handed to this process = %v; want ErrHeld", port, err)
	}
}
