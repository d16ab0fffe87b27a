package portalloc_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
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
		{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}, {Name: "grpc", Shared: true}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	holder := testHolder(t, a)
	if _, err := a.Allocate(context.Background(), portalloc.Request{Label: "shutdown/lease", Holder: holder, TTL: time.Hour}); err != nil {
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
	if n, err := a.ReleaseHolder(ctx, holder, store.Filter{}); n != 1 || err != nil {
		t.Errorf("ReleaseHolder(cancelled ctx) = %d, %v; want 1, nil", n, err)
	}
	if got := rowsLabelled(t, dir, "shutdown/"); len(got) != 0 {
		t.Errorf("rows after releases under a cancelled context: %v; want none", got)
	}
	if h := a.Held(); len(h) != 0 {
		t.Errorf("Held() = %v; want none", h)
	}
}

// TestHandedPortsOutliveTheirSet: ports a set or an Allocator handed to
// children stay the children's when the set is released and the Allocator
// closed; those of a child that has exited are reaped (Reap, here), and a
// child that still runs keeps its ports.
func TestHandedPortsOutliveTheirSet(t *testing.T) {
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
	owners := func() map[string]int {
		m := map[string]int{}
		for _, row := range rowsLabelled(t, dir, "kids/") {
			m[row.Label] = row.Owner.PID
		}
		return m
	}
	want := map[string]int{"kids/svc/0/http": dead.cmd.Process.Pid, "kids/svc/1/http": alive.cmd.Process.Pid, "kids/own": own.cmd.Process.Pid}
	if got := owners(); len(got) != 3 || got["kids/svc/0/http"] != want["kids/svc/0/http"] || got["kids/svc/1/http"] != want["kids/svc/1/http"] || got["kids/own"] != want["kids/own"] {
		t.Errorf("rows after Set.Release = %v; want the children's, %v, until reaped", got, want)
	}
	// Reap deletes the exited children's rows, unless the store's own
	// sweep, which runs right after it opens, got there first.
	if _, err := a.Reap(ctx); err != nil {
		t.Errorf("Reap = %v", err)
	}
	if got := owners(); len(got) != 1 || got["kids/svc/1/http"] != alive.cmd.Process.Pid {
		t.Errorf("rows after Reap = %v; want only kids/svc/1/http of the running pid %d", got, alive.cmd.Process.Pid)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if got := owners(); len(got) != 1 || got["kids/svc/1/http"] != alive.cmd.Process.Pid {
		t.Errorf("rows after Close = %v; want kids/svc/1/http of the running pid %d still", got, alive.cmd.Process.Pid)
	}
	if _, err := a.Reap(ctx); err == nil {
		t.Error("Reap after Close = nil; want ErrClosed")
	}
}
