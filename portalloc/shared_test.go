package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// Several Allocators, sets and pools of one process reserve as the same
// owner, so the store has one row for a port they share. These tests check
// that the row lives until the last of them lets go, by asking another
// process, which must find the port held until then.

func init() {
	// try reserves BERTH_TEST_PORT on 127.0.0.1 in BERTH_STATE_DIR, prints
	// "reserved" or "held PID", and exits, releasing what it got.
	workers["try"] = func(ctx context.Context) error {
		a, err := portalloc.New(ctx, workerConfig())
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		port, _ := strconv.Atoi(os.Getenv("BERTH_TEST_PORT"))
		_, err = a.Reserve(ctx, portalloc.Request{Addr: lo4, Label: "try"}, uint16(port))
		var ce *store.ConflictError
		switch {
		case err == nil:
			fmt.Println("reserved")
		case errors.As(err, &ce):
			fmt.Println("held", ce.Holder.Owner.PID)
		default:
			return err
		}
		return nil
	}
}

// otherProcessGets reports what another process gets when it reserves
// port: "reserved", or "held PID".
func otherProcessGets(tb testing.TB, dir string, port uint16) string {
	tb.Helper()
	p := spawn(tb, "try", "BERTH_STATE_DIR="+dir, "BERTH_TEST_PORT="+strconv.Itoa(int(port)))
	line, err := p.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("try worker: %q, %v", line, err)
	}
	_ = p.cmd.Wait()
	return strings.TrimSpace(line)
}

// TestSharedReservationOutlivesOtherAllocators: B reserves the port A
// holds and gets A's row; B's Release and Close, and a third Allocator's
// stray Release, leave it reserved while A holds it. Another process is
// refused the port until A closes.
func TestSharedReservationOutlivesOtherAllocators(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	port := freeRun(t, 1)
	self := fmt.Sprint("held ", os.Getpid())
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	if _, err := a.Reserve(ctx, portalloc.Request{Label: "a"}, port); err != nil {
		t.Fatal(err)
	}

	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	rb, err := b.Reserve(ctx, portalloc.Request{Label: "b"}, port)
	if err != nil || rb.Port != port || rb.Label != "a" {
		t.Fatalf("B.Reserve of A's port = %+v, %v; want A's reservation back", rb, err)
	}
	if err := b.Release(ctx, rb); err != nil {
		t.Errorf("B.Release = %v", err)
	}
	if got := otherProcessGets(t, dir, port); got != self {
		t.Fatalf("after B released its hold, another process got %q; want %q: A still holds the port", got, self)
	}
	if _, err := b.Reserve(ctx, portalloc.Request{}, port); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("B.Close = %v", err)
	}
	if got := otherProcessGets(t, dir, port); got != self {
		t.Fatalf("after B closed, another process got %q; want %q: A still holds the port", got, self)
	}
	if !holdsPort(a, port) {
		t.Errorf("A.Held() = %v; want port %d", a.Held(), port)
	}

	// C's release of a row it never held is refused, and deletes nothing.
	c := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	if err := c.Release(ctx, rb); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "another Allocator of this process") {
		t.Errorf("Release by an Allocator that does not hold it = %v; want ErrInvalid naming the holder", err)
	}
	if got := otherProcessGets(t, dir, port); got != self {
		t.Fatalf("after a stray Release, another process got %q; want %q", got, self)
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := otherProcessGets(t, dir, port); got != "reserved" {
		t.Errorf("after A, the last holder, closed, another process got %q; want reserved", got)
	}
}

// TestTransferOfSharedReservation: A cannot hand a port to a child while B
// holds it too, since the transfer would take it from B; once B let go, it
// can.
func TestTransferOfSharedReservation(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	port := freeRun(t, 1)
	sleeper := spawn(t, "sleeper")
	t.Cleanup(func() { _ = sleeper.cmd.Process.Kill() }) // it never reads stdin
	child := sleeper.cmd.Process.Pid
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	ra, err := a.Reserve(ctx, portalloc.Request{}, port)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Reserve(ctx, portalloc.Request{}, port)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Transfer(ctx, ra, child)
	if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "another Allocator of this process") {
		t.Fatalf("Transfer of a port another Allocator holds = %v; want ErrInvalid naming it", err)
	}
	if got := otherProcessGets(t, dir, port); got != fmt.Sprint("held ", os.Getpid()) {
		t.Fatalf("after the refused Transfer, another process got %q; want it held by this process", got)
	}
	// Two holds of A's own are refused the same way.
	if _, err := a.Reserve(ctx, portalloc.Request{}, port); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, rb); err != nil {
		t.Fatal(err)
	}
	if err := a.Transfer(ctx, ra, child); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "2 holds of this Allocator") {
		t.Fatalf("Transfer of a port A holds twice = %v; want ErrInvalid saying so", err)
	}
	if err := a.Release(ctx, ra); err != nil {
		t.Fatal(err)
	}
	if err := a.Transfer(ctx, ra, child); err != nil {
		t.Fatalf("Transfer once A alone holds it once = %v", err)
	}
	if holdsPort(a, port) {
		t.Errorf("A.Held() after Transfer = %v; want without port %d", a.Held(), port)
	}
	if got := otherProcessGets(t, dir, port); got != fmt.Sprint("held ", child) {
		t.Errorf("after Transfer, another process got %q; want held by the child %d", got, child)
	}
}

// TestFailedSetKeepsEarlierReservation: an AllocateSet whose fixed port is
// one this process already holds, and which then fails on a port another
// process holds, leaves the earlier reservation in place, whether it was
// made by the same Allocator or by another one of the process.
func TestFailedSetKeepsEarlierReservation(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := freeRun(t, 2)
	mine, theirs := base, base+1
	holdInWorker(t, dir, lo4, theirs)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	if _, err := a.Reserve(ctx, portalloc.Request{Label: "mine"}, mine); err != nil {
		t.Fatal(err)
	}
	spec := portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "g", Ports: []portset.PortSpec{
		{Name: "first", Shared: true, Port: mine},
		{Name: "second", Shared: true, Port: theirs},
	}}}}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	for _, x := range []struct {
		name string
		a    *portalloc.Allocator
	}{{"the same Allocator", a}, {"another Allocator", b}} {
		if _, err := portset.Allocate(ctx, x.a, spec); !errors.Is(err, store.ErrHeld) {
			t.Fatalf("AllocateSet from %s over a port another process holds = %v; want ErrHeld", x.name, err)
		}
		if got, want := otherProcessGets(t, dir, mine), fmt.Sprint("held ", os.Getpid()); got != want {
			t.Fatalf("after a failed AllocateSet from %s, another process got %q for the port reserved before; want %q", x.name, got, want)
		}
		if !holdsPort(a, mine) {
			t.Errorf("after a failed AllocateSet from %s, A.Held() = %v; want port %d", x.name, a.Held(), mine)
		}
	}
	if len(b.Held()) != 0 {
		t.Errorf("B.Held() after its failed set = %v; want none", b.Held())
	}

	// The ports an earlier allocation of the same spec holds stay too.
	ok := portset.SetSpec{Name: "t", Groups: []portset.GroupSpec{{Name: "g", Ports: []portset.PortSpec{{Name: "http"}}}}}
	set, err := portset.Allocate(ctx, a, ok)
	if err != nil {
		t.Fatal(err)
	}
	bad := ok
	bad.Groups = append(slices.Clone(ok.Groups), portset.GroupSpec{Name: "db", Ports: []portset.PortSpec{{Name: "pg", Port: theirs}}})
	if _, err := portset.Allocate(ctx, a, bad); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("AllocateSet of the grown spec = %v; want ErrHeld", err)
	}
	http := member(t, set, "g", 0).Ports["http"].Port
	if got := otherProcessGets(t, dir, http); got != fmt.Sprint("held ", os.Getpid()) {
		t.Errorf("after a failed AllocateSet reused it, another process got %q for the earlier set's port %d", got, http)
	}
}
