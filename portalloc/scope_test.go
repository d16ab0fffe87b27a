package portalloc_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/live"
	"github.com/berth-go/berth/portalloc/portset"
)

// TestScopeStickyPortsApart: two scopes of one store use the label "web"
// at once and get two ports; each gets its own back after a restart (a new
// Allocator); and a sticky port another process holds is never handed out
// again, whatever the scope remembers.
func TestScopeStickyPortsApart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	open := func(scope string) *portalloc.Allocator {
		t.Helper()
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange, Scope: scope})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	web := portalloc.Request{Label: "web", Sticky: true}
	first := map[string]uint16{}
	var as []*portalloc.Allocator
	for _, scope := range []string{"shop", "shop-wt2"} {
		a := open(scope)
		as = append(as, a)
		r, err := a.Allocate(ctx, web)
		if err != nil {
			t.Fatal(err)
		}
		if want := "web@" + scope; r.Label != want {
			t.Errorf("scope %s: Allocate(web).Label = %q; want %q", scope, r.Label, want)
		}
		first[scope] = r.Port
	}
	if first["shop"] == first["shop-wt2"] {
		t.Fatalf("scopes shop and shop-wt2 both hold port %d for web; want two ports", first["shop"])
	}
	for _, a := range as {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A restart: each scope gets its port back.
	for _, scope := range []string{"shop-wt2", "shop"} {
		a := open(scope)
		r, err := a.Allocate(ctx, web)
		if err != nil {
			t.Fatal(err)
		}
		if r.Port != first[scope] {
			t.Errorf("scope %s after a restart: port %d; want its sticky port %d", scope, r.Port, first[scope])
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Another process holds shop's sticky port: shop gets another one.
	holdInWorker(t, dir, netip.MustParseAddr("127.0.0.1"), first["shop"])
	a := open("shop")
	defer func() { _ = a.Close() }()
	r, err := a.Allocate(ctx, web)
	if err != nil {
		t.Fatal(err)
	}
	if r.Port == first["shop"] {
		t.Errorf("scope shop got its sticky port %d while another process holds it", r.Port)
	}
}

// TestScopeSeededOrder: in a fresh store, a label's first port in a scope
// is the same every time (an order seeded by the scope's name and the
// label), and other labels mostly start elsewhere.
func TestScopeSeededOrder(t *testing.T) {
	ctx := context.Background()
	firstPort := func(scope, label string) uint16 {
		t.Helper()
		a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Scope: scope})
		r, err := a.Allocate(ctx, portalloc.Request{Label: label})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
		return r.Port
	}
	// A path scope counts by its last element: the same checkout at
	// another place (another machine, another user) starts alike.
	p1, p2 := firstPort("/home/ana/src/shop", "web"), firstPort("/srv/ci/work/shop", "web")
	if p1 != p2 {
		t.Errorf("first port of web in /home/ana/src/shop = %d, in /srv/ci/work/shop = %d; want the same", p1, p2)
	}
	seen := map[uint16]bool{}
	for _, l := range []string{"web", "api", "db", "cache", "metrics", "grpc", "admin", "docs"} {
		seen[firstPort("shop", l)] = true
	}
	if len(seen) < 6 {
		t.Errorf("8 labels of scope shop start at %d ports; want them mostly apart", len(seen))
	}
}

// TestPortOfLiveOnly: PortOf and LivePorts see the reservations of live
// owners only (here, a worker process's, until it exits), and never take
// them.
func TestPortOfLiveOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	free, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, free); err != nil {
		t.Fatal(err)
	}
	w := holdInWorker(t, dir, netip.MustParseAddr("127.0.0.1"), free.Port) // labelled "worker"
	s, err := portalloc.OpenStore(ctx, portalloc.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	got, err := live.PortOf(ctx, s, "", "worker", portalloc.TCP)
	if err != nil || got.Port != free.Port || got.Var != "WORKER_PORT" || got.OwnerPID != w.cmd.Process.Pid {
		t.Errorf("PortOf(worker) = %+v, %v; want port %d of pid %d as WORKER_PORT", got, err, free.Port, w.cmd.Process.Pid)
	}
	if _, err := live.PortOf(ctx, s, "", "worker", portalloc.UDP); !errors.Is(err, live.ErrNoReservation) {
		t.Errorf("PortOf(worker, udp) = %v; want ErrNoReservation", err)
	}
	if _, err := live.PortOf(ctx, s, "shop", "worker", portalloc.TCP); !errors.Is(err, live.ErrNoReservation) {
		t.Errorf("PortOf in scope shop of the empty scope's label = %v; want ErrNoReservation", err)
	}
	var fe *portalloc.FieldError
	if _, err := live.PortOf(ctx, s, "", "", portalloc.TCP); !errors.As(err, &fe) {
		t.Errorf("PortOf(\"\") = %v; want a *FieldError", err)
	}
	w.kill(t)
	if got, err := live.PortOf(ctx, s, "", "worker", portalloc.TCP); !errors.Is(err, live.ErrNoReservation) {
		t.Errorf("PortOf(worker) after the worker died = %+v, %v; want ErrNoReservation", got, err)
	}
	if ports, err := live.Ports(ctx, s, ""); err != nil || len(ports) != 0 {
		t.Errorf("LivePorts after the worker died = %+v, %v; want none", ports, err)
	}
}

// TestScopeSets: one set spec allocated in two scopes gets two sets of
// ports; allocated again in the same scope, it gets the ports it holds
// back.
func TestScopeSets(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	spec := portset.SetSpec{Name: "dev", Groups: []portset.GroupSpec{{Name: "web", Ports: []portset.PortSpec{{Name: "http"}}}}}
	port := func(a *portalloc.Allocator) portalloc.Reservation {
		t.Helper()
		s, err := portset.Allocate(ctx, a, spec)
		if err != nil {
			t.Fatal(err)
		}
		return member(t, s, "web", 0).Ports["http"]
	}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Scope: "shop"})
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Scope: "shop-wt2"})
	ra, rb := port(a), port(b)
	if ra.Port == rb.Port {
		t.Errorf("set dev in scopes shop and shop-wt2: both port %d; want two", ra.Port)
	}
	if ra.Label != "dev/web/0/http@shop" {
		t.Errorf("label of dev's port in scope shop = %q; want %q", ra.Label, "dev/web/0/http@shop")
	}
	if again := port(a); again.Port != ra.Port {
		t.Errorf("set dev allocated again in scope shop: port %d; want the one it holds, %d", again.Port, ra.Port)
	}
}

// TestConfigScopeRefused: New and ConfigFromEnv resolve a scope as
// package portalloc/scope does, and refuse a mode berth does not know with
// a *FieldError that names the field or variable that gave it.
func TestConfigScopeRefused(t *testing.T) {
	ctx := context.Background()
	_, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Scope: "git:"})
	var fe *portalloc.FieldError
	if !errors.As(err, &fe) || fe.Field != "Config.Scope" || !errors.Is(err, portalloc.ErrInvalidRequest) {
		t.Errorf(`New(Config{Scope: "git:"}) = %v; want a *FieldError for Config.Scope wrapping ErrInvalidRequest`, err)
	}
	t.Setenv(portalloc.EnvScope, "env:SHOP")
	_, err = portalloc.ConfigFromEnv()
	if !errors.As(err, &fe) || fe.Field != portalloc.EnvScope {
		t.Errorf("ConfigFromEnv() with %s=env:SHOP = %v; want a *FieldError for %s", portalloc.EnvScope, err, portalloc.EnvScope)
	}
}

// TestConfigScopeDir: New resolves the mode "dir" once, to the working
// directory, and Config() returns it.
func TestConfigScopeDir(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Scope: "dir"})
	if got := a.Config().Scope; got != dir {
		t.Errorf(`New(Config{Scope: "dir"}).Config().Scope in %s = %q; want %q`, dir, got, dir)
	}
}
