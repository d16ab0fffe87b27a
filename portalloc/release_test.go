package portalloc_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/lease"
	"github.com/berth-go/berth/portalloc/portset"
)

// TestReleaseWithCancelledContext: the shutdown path releases. A deferred
// Release under signal.NotifyContext runs after the signal cancelled its
// context; Release, Set.Release and ReleaseHolder go on within
// Config.Timeout, and the rows are gone from the store afterwards.
func TestReleaseWithCancelledContext(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	dir := a.Config().StateDir
	r, err := a.Allocate(context.Background(), portalloc.Request{Label: "shutdown/one"})
	if err != nil {
		t.Fatal(err)
	}
	set, err := portset.Allocate(context.Background(), a, portset.SetSpec{Name: "shutdown", Groups: []portset.GroupSpec{
		{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}, {Name: "grpc", Scope: portset.ScopeGroup}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Allocate(context.Background(), a, portalloc.Request{Label: "shutdown/lease"}, lease.Lease{Holder: "ci/job-1", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := rowsLabelled(t, dir, "shutdown/"); len(got) != 5 {
		t.Fatalf("%d rows before the releases; want 5: %v", len(got), got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // as the shutdown signal does
	if err := a.Release(ctx, r); err != nil {
		t.Errorf("Release(cancelled ctx) = %v; want nil", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Errorf("Set.Release(cancelled ctx) = %v; want nil", err)
	}
	if n, err := lease.Release(ctx, a, "ci/job-1", lease.Filter{}); n != 1 || err != nil {
		t.Errorf("ReleaseHolder(cancelled ctx) = %d, %v; want 1, nil", n, err)
	}
	if got := rowsLabelled(t, dir, "shutdown/"); len(got) != 0 {
		t.Errorf("rows after releases under a cancelled context: %v; want none", got)
	}
	if h := a.Held(); len(h) != 0 {
		t.Errorf("Held() = %v; want none", h)
	}
}

// TestReleaseReapsExitedChildren: ports handed to children that have
// exited are released with the set that handed them over, and with the
// Allocator, without a Reap; a child that still runs keeps its ports.
func TestReleaseReapsExitedChildren(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	dir := a.Config().StateDir
	set, err := portset.Allocate(ctx, a, portset.SetSpec{Name: "kids", Groups: []portset.GroupSpec{
		{Name: "svc", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	dead, alive := spawn(t, "sleeper"), spawn(t, "sleeper")
	t.Cleanup(func() { alive.kill(t) }) // a sleeper does not end when its stdin closes
	if err := set.Transfer(ctx, member(t, set, "svc", 0), dead.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := set.Transfer(ctx, member(t, set, "svc", 1), alive.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	r, err := a.Allocate(ctx, portalloc.Request{Label: "kids/own"})
	if err != nil {
		t.Fatal(err)
	}
	own := spawn(t, "sleeper")
	if err := a.Transfer(ctx, r, own.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	dead.kill(t)
	own.kill(t)

	if err := set.Release(ctx); err != nil {
		t.Fatalf("Set.Release = %v", err)
	}
	rows := rowsLabelled(t, dir, "kids/")
	labels := map[string]int{}
	for _, row := range rows {
		labels[row.Label] = row.Owner.PID
	}
	if _, ok := labels["kids/svc/0/http"]; ok {
		t.Errorf("Set.Release left the port of exited pid %d: %v", dead.cmd.Process.Pid, rows)
	}
	if pid := labels["kids/svc/1/http"]; pid != alive.cmd.Process.Pid {
		t.Errorf("the running child's port is owned by pid %d after Set.Release; want it kept by pid %d: %v", pid, alive.cmd.Process.Pid, rows)
	}
	if _, ok := labels["kids/own"]; !ok {
		t.Errorf("Set.Release released the Allocator's own transfer: %v", rows)
	}

	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	rows = rowsLabelled(t, dir, "kids/")
	if len(rows) != 1 || rows[0].Label != "kids/svc/1/http" || rows[0].Owner.PID != alive.cmd.Process.Pid {
		t.Errorf("rows after Close: %v; want only kids/svc/1/http of the running pid %d", rows, alive.cmd.Process.Pid)
	}
}

// TestTransferPrunesExitedChildren: a supervisor that hands ports to child
// after child and never releases a set nor closes still has the ports of
// its exited children released, once it has handed over HandedPrune.
func TestTransferPrunesExitedChildren(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	dir := a.Config().StateDir
	dead := spawn(t, "sleeper")
	for i := range portalloc.HandedPrune - 1 {
		r, err := a.Allocate(ctx, portalloc.Request{Label: "prune/dead/" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Transfer(ctx, r, dead.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	dead.kill(t)
	if got := len(rowsLabelled(t, dir, "prune/dead/")); got != portalloc.HandedPrune-1 {
		t.Fatalf("%d rows of the exited child before the next Transfer; want %d", got, portalloc.HandedPrune-1)
	}
	alive := spawn(t, "sleeper")
	t.Cleanup(func() { alive.kill(t) })
	r, err := a.Allocate(ctx, portalloc.Request{Label: "prune/alive"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Transfer(ctx, r, alive.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if got := rowsLabelled(t, dir, "prune/dead/"); len(got) != 0 {
		t.Errorf("%d rows of the exited child after the Transfer that reached HandedPrune; want none", len(got))
	}
	if got := rowsLabelled(t, dir, "prune/alive"); len(got) != 1 || got[0].Owner.PID != alive.cmd.Process.Pid {
		t.Errorf("rows of the running child: %v; want its one row", got)
	}
}
