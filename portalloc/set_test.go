package portalloc_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// apiWebSpec is a set of two groups: api with 3 members, each with its own
// http port and a shared grpc port; web with one member that refers to the
// shared grpc port and to member 0's http port.
func apiWebSpec() portset.SetSpec {
	return portset.SetSpec{Name: "dev", Groups: []portset.GroupSpec{
		{Name: "api", Members: 3, Ports: []portset.PortSpec{
			{Name: "http"},
			{Name: "grpc", Shared: true},
		}},
		{Name: "web", Ports: []portset.PortSpec{{Name: "http"}}, Refs: []portset.RefSpec{
			{Env: "API_GRPC", To: "api.grpc"},
			{Env: "API_PRIMARY_HTTP", To: "api.0.http"},
		}},
	}}
}

// member returns member i of group, failing the test if the set has none.
func member(tb testing.TB, s *portset.Set, group string, i int) *portset.Member {
	tb.Helper()
	m, err := s.Member(group, i)
	if err != nil {
		tb.Fatalf("Member(%q, %d) = %v", group, i, err)
	}
	return m
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestAllocateSet(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	set, err := portset.Allocate(ctx, a, apiWebSpec())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(set.Members()); n != 4 {
		t.Fatalf("%d members; want 4", n)
	}
	https := map[uint16]bool{}
	grpc := member(t, set, "api", 0).Ports["grpc"].Port
	for i := range 3 {
		m := member(t, set, "api", i)
		https[m.Ports["http"].Port] = true
		if m.Ports["grpc"].Port != grpc {
			t.Errorf("api.%d grpc = %d; want the shared %d", i, m.Ports["grpc"].Port, grpc)
		}
		env := envMap(m.Env())
		if env["API_HTTP_PORT"] != strconv.Itoa(int(m.Ports["http"].Port)) || env["API_GRPC_PORT"] != strconv.Itoa(int(grpc)) {
			t.Errorf("api.%d env = %v", i, m.Env())
		}
	}
	if len(https) != 3 || https[grpc] {
		t.Errorf("api http ports %v and grpc %d; want 3 distinct http ports apart from grpc", https, grpc)
	}
	web := member(t, set, "web", 0)
	env := envMap(web.Env())
	if env["API_GRPC"] != strconv.Itoa(int(grpc)) || env["API_PRIMARY_HTTP"] != strconv.Itoa(int(member(t, set, "api", 0).Ports["http"].Port)) {
		t.Errorf("web env = %v; want refs to api.grpc=%d and api.0.http", web.Env(), grpc)
	}
	if env["WEB_HTTP_PORT"] != strconv.Itoa(int(web.Ports["http"].Port)) {
		t.Errorf("web env = %v; want WEB_HTTP_PORT", web.Env())
	}
	// Every port was bind-probed and is bindable now.
	for _, m := range set.Members() {
		for _, r := range m.Ports {
			if !bindable(t, r) {
				t.Errorf("port %v of the set is not bindable", r)
			}
		}
	}
	man, _ := json.Marshal(set.Manifest())
	if !strings.Contains(string(man), `"shared":true`) || !strings.Contains(string(man), `"label":"dev/api/0/http"`) {
		t.Errorf("manifest %s lacks shared ports or labels", man)
	}
	if n := len(a.Held()); n != 5 {
		t.Errorf("Held() has %d reservations; want the set's 5", n)
	}

	// Idempotent: again from the same Allocator, the same ports.
	again, err := portset.Allocate(ctx, a, apiWebSpec())
	if err != nil || member(t, again, "api", 2).Ports["http"] != member(t, set, "api", 2).Ports["http"] ||
		member(t, again, "web", 0).Ports["http"] != web.Ports["http"] {
		t.Errorf("AllocateSet again = %v; want the same ports", err)
	}

	if err := set.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Errorf("second Release = %v; want nil", err)
	}
	// again holds the rows too: they stay until the last holder lets go.
	if got := rowsLabelled(t, a.Config().StateDir, "dev/"); len(got) != 5 {
		t.Errorf("rows after one of two holding sets released: %v; want all 5", got)
	}
	if err := again.Release(ctx); err != nil {
		t.Errorf("Release of the last holder = %v; want nil", err)
	}
	if got := rowsLabelled(t, a.Config().StateDir, "dev/"); len(got) != 0 {
		t.Errorf("rows after Release: %v", got)
	}
}

// TestAllocateSetAtomic: when a fixed port is held by another process, the
// set fails and none of its ports stay reserved.
func TestAllocateSetAtomic(t *testing.T) {
	dir := t.TempDir()
	busy := freeRun(t, 1)
	holdInWorker(t, dir, lo4, busy)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	spec := apiWebSpec()
	spec.Groups = append(spec.Groups, portset.GroupSpec{Name: "db", Ports: []portset.PortSpec{{Name: "pg", Port: busy}}})
	_, err := portset.Allocate(context.Background(), a, spec)
	if !errors.Is(err, store.ErrHeld) {
		t.Fatalf("AllocateSet with a held fixed port = %v; want ErrHeld", err)
	}
	if got := rowsLabelled(t, dir, "dev/"); len(got) != 0 {
		t.Errorf("a failed set left %d rows: %v", len(got), got)
	}
	if len(a.Held()) != 0 {
		t.Errorf("Held() = %v; want none", a.Held())
	}
}

// TestAllocateSetCheckedBeforeStore: a spec whose variables collide is
// refused before any port is taken, with an error that names both groups,
// both ports and the variable.
func TestAllocateSetCheckedBeforeStore(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	spec := portset.SetSpec{Name: "clash", Groups: []portset.GroupSpec{
		{Name: "api", Ports: []portset.PortSpec{{Name: "http-admin"}, {Name: "grpc"}}},
		{Name: "api-http", Ports: []portset.PortSpec{{Name: "web"}, {Name: "admin"}}},
	}}
	_, err := portset.Allocate(context.Background(), a, spec)
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "SetSpec" || fe.At != "groups[1].ports[1].name" {
		t.Fatalf("AllocateSet = %v; want a *FieldError for SetSpec at groups[1].ports[1].name", err)
	}
	for _, want := range []string{`"api"`, `"api-http"`, `"http-admin"`, `"admin"`, "$API_HTTP_ADMIN_PORT", "rename"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("AllocateSet = %v; want it to say %s", err, want)
		}
	}
	if got := rowsLabelled(t, a.Config().StateDir, ""); len(got) != 0 {
		t.Errorf("a refused spec took %d ports: %v", len(got), got)
	}
	if st := a.Stats(); st.Allocations != (portalloc.Counts{}) || st.Errors != (portalloc.Counts{}) {
		t.Errorf("Stats() = %+v after a refused spec; want no allocation tried", st)
	}
}

// TestStickyPort: a sticky request gets the port its label had last time,
// after a restart; when another process holds it, another port, with the
// reason logged.
func TestStickyPort(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	log := &logCounter{}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Logger: log.logger()})
	r1, err := a.Allocate(ctx, portalloc.Request{Label: "pg", Sticky: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Release(ctx, r1)
	_ = a.Close()

	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Logger: log.logger()})
	r2, err := b.Allocate(ctx, portalloc.Request{Label: "pg", Sticky: true})
	if err != nil || r2.Port != r1.Port {
		t.Fatalf("sticky Allocate after a restart = %d, %v; want %d", r2.Port, err, r1.Port)
	}
	_ = b.Release(ctx, r2)

	// Taken by another process meanwhile: a fresh port, and the reason logged.
	holdInWorker(t, dir, lo4, r1.Port)
	r3, err := b.Allocate(ctx, portalloc.Request{Label: "pg", Sticky: true})
	if err != nil || r3.Port == r1.Port {
		t.Fatalf("sticky Allocate of a held port = %d, %v; want another port", r3.Port, err)
	}
	if n := log.count("sticky port was not free"); n != 1 {
		t.Errorf("the reason was logged %d times; want once. Log:\n%s", n, log.dump())
	}
	// The label now remembers the new port.
	_ = b.Release(ctx, r3)
	if r4, err := b.Allocate(ctx, portalloc.Request{Label: "pg", Sticky: true}); err != nil || r4.Port != r3.Port {
		t.Errorf("sticky Allocate after it moved = %d, %v; want the new port %d", r4.Port, err, r3.Port)
	}
	if _, err := b.Allocate(ctx, portalloc.Request{Sticky: true}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("sticky Allocate without a label = %v; want ErrInvalid", err)
	}
}
