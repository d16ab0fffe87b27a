package portalloc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
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
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange, Scope: scope, IgnoreEnv: true})
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
	holdInWorker(t, dir, lo4, first["shop"])
	a := open("shop")
	defer func() { _ = a.Close() }()
	r, err := a.Allocate(ctx, web)
	if err != nil {
		t.Fatal(err)
	}
	if r.Port == first["shop"] {
		t.Errorf("scope shop got its sticky port %d while another process holds it", r.Port)
	}
	if rows := storeRows(t, dir, store.Filter{Label: "web@shop"}); len(rows) != 1 || rows[0].Port != r.Port {
		t.Errorf("rows labelled web@shop = %v; want the one of port %d", rows, r.Port)
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

// TestScopeSets: one set spec allocated in two scopes gets two sets of
// ports; allocated again in the same scope, it gets the ports it holds
// back.
func TestScopeSets(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	spec := portset.SetSpec{Name: "dev", Groups: []portset.GroupSpec{{Name: "web", Ports: []portset.PortSpec{{Name: "http"}}}}}
	port := func(a *portalloc.Allocator) store.Reservation {
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

// TestConfigScopeRefused: New and Resolve resolve a scope as ResolveScope
// does, and refuse a mode berth does not know, or a label with the scope
// too long, with a *FieldError that names the field or variable that gave
// it.
func TestConfigScopeRefused(t *testing.T) {
	unsetBerthEnv(t)
	ctx := context.Background()
	_, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Scope: "git:"})
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "Config.Scope" || !errors.Is(err, store.ErrInvalid) {
		t.Errorf(`New(Config{Scope: "git:"}) = %v; want a *FieldError for Config.Scope wrapping ErrInvalid`, err)
	}
	t.Setenv("BERTH_SCOPE", "env:SHOP")
	_, err = portalloc.Config{}.Resolve()
	if !errors.As(err, &fe) || fe.Field != "BERTH_SCOPE" {
		t.Errorf("Resolve() with BERTH_SCOPE=env:SHOP = %v; want a *FieldError for BERTH_SCOPE", err)
	}
	if _, err := portalloc.ResolveScope(strings.Repeat("s", 201)); !errors.As(err, &fe) || fe.Field != "scope" {
		t.Errorf("ResolveScope of 201 bytes = %v; want a *FieldError for scope", err)
	}
	if _, err := portalloc.ResolveScope("a\x1b[2Jb"); !errors.As(err, &fe) || fe.Field != "scope" {
		t.Errorf("ResolveScope with an escape = %v; want a *FieldError for scope", err)
	}

	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Scope: strings.Repeat("s", 200)})
	_, err = a.Allocate(ctx, portalloc.Request{Label: strings.Repeat("l", 56)})
	if !errors.As(err, &fe) || fe.Field != "Request.Label" || !strings.Contains(fe.Want, "together with the scope") {
		t.Errorf("Allocate of a label that, with its scope, is too long = %v; want a *FieldError for Request.Label naming the scope", err)
	}
	if r, err := a.Allocate(ctx, portalloc.Request{Label: strings.Repeat("l", 55)}); err != nil || len(r.Label) != store.MaxLabelLen {
		t.Errorf("Allocate of a label that fits with its scope = %v, %v; want a label of %d bytes", r, err, store.MaxLabelLen)
	}
}

// TestConfigScopeDir: New resolves the modes "dir" and "git" once, to the
// working directory and the root of its git worktree, and Config() returns
// them; outside a worktree "git" is refused.
func TestConfigScopeDir(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "cmd", "api")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Scope: "dir"})
	if got := a.Config().Scope; got != sub {
		t.Errorf(`New(Config{Scope: "dir"}).Config().Scope in %s = %q; want %q`, sub, got, sub)
	}
	var fe *store.FieldError
	if _, err := portalloc.ResolveScope("git"); !errors.As(err, &fe) || !strings.Contains(fe.Want, "in no git worktree") {
		t.Errorf(`ResolveScope("git") outside a worktree = %v; want a *FieldError saying so`, err)
	}
	if err := os.Mkdir(filepath.Join(dir, ".git"), 0o700); err != nil {
		t.Fatal(err)
	}
	g := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Scope: "git"})
	if got := g.Config().Scope; got != dir {
		t.Errorf(`New(Config{Scope: "git"}).Config().Scope in %s = %q; want the worktree's root %q`, sub, got, dir)
	}
}
