package portalloc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
)

// apiWebSpec is the set of the issue: api with 3 members, each with its own
// http port and a shared grpc port; web with one member that refers to the
// shared grpc port and to member 0's http port.
func apiWebSpec() portalloc.SetSpec {
	return portalloc.SetSpec{Name: "dev", Groups: []portalloc.GroupSpec{
		{Name: "api", Members: 3, Ports: []portalloc.PortSpec{
			{Name: "http"},
			{Name: "grpc", Scope: portalloc.ScopeGroup},
		}},
		{Name: "web", Ports: []portalloc.PortSpec{{Name: "http"}}, Refs: []portalloc.RefSpec{
			{Env: "API_GRPC", To: "api.grpc"},
			{Env: "API_PRIMARY_HTTP", To: "api.0.http"},
		}},
	}}
}

// member returns member i of group, failing the test if the set has none.
func member(t *testing.T, s *portalloc.Set, group string, i int) *portalloc.Member {
	t.Helper()
	m, err := s.Member(group, i)
	if err != nil {
		t.Fatalf("Member(%q, %d) = %v", group, i, err)
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
	set, err := a.AllocateSet(ctx, apiWebSpec())
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
			_ = listen(t, r.Address, r.Port).Close()
		}
	}
	man, _ := json.Marshal(set.Manifest())
	if !strings.Contains(string(man), `"scope":"group"`) || !strings.Contains(string(man), `"label":"dev/api/0/http"`) {
		t.Errorf("manifest %s lacks scopes or labels", man)
	}

	// Idempotent: again, and from a second Allocator of this process.
	again, err := a.AllocateSet(ctx, apiWebSpec())
	if err != nil || member(t, again, "api", 2).Ports["http"] != member(t, set, "api", 2).Ports["http"] {
		t.Errorf("AllocateSet again = %v; want the same ports", err)
	}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: a.Config().StateDir})
	other, err := b.AllocateSet(ctx, apiWebSpec())
	if err != nil || member(t, other, "web", 0).Ports["http"] != web.Ports["http"] {
		t.Errorf("AllocateSet from another Allocator = %v; want the same ports", err)
	}

	if err := set.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Errorf("second Release = %v; want nil", err)
	}
	// again and other hold the rows too: they stay until the last lets go.
	if got := rowsLabelled(t, a.Config().StateDir, "dev/"); len(got) != 5 {
		t.Errorf("rows after one of three holding sets released: %v; want all 5", got)
	}
	if err := again.Release(ctx); err != nil {
		t.Errorf("Release of again = %v", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Errorf("Release of the last holder = %v; want nil", err)
	}
	if got := rowsLabelled(t, a.Config().StateDir, "dev/"); len(got) != 0 {
		t.Errorf("rows after Release: %v", got)
	}
}

func rowsLabelled(t *testing.T, dir, prefix string) []statestore.Reservation {
	t.Helper()
	s, err := statestore.Open(context.Background(), dir+"/berth.db", statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.List(context.Background(), statestore.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []statestore.Reservation
	for _, r := range rows {
		if strings.HasPrefix(r.Label, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// TestAllocateSetAtomic: when a fixed port is held by another process, the
// set fails and none of its ports stay reserved.
func TestAllocateSetAtomic(t *testing.T) {
	dir := t.TempDir()
	busy := freeRun(t, 1)
	holdInWorker(t, dir, lo4, busy)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	spec := apiWebSpec()
	spec.Groups = append(spec.Groups, portalloc.GroupSpec{Name: "db", Ports: []portalloc.PortSpec{{Name: "pg", Port: busy}}})
	_, err := a.AllocateSet(context.Background(), spec)
	if !errors.Is(err, portalloc.ErrPortHeld) {
		t.Fatalf("AllocateSet with a held fixed port = %v; want ErrPortHeld", err)
	}
	if got := rowsLabelled(t, dir, "dev/"); len(got) != 0 {
		t.Errorf("a failed set left %d rows: %v", len(got), got)
	}
	if len(a.Held()) != 0 {
		t.Errorf("Held() = %v; want none", a.Held())
	}
}

func manyGroups(n int) []portalloc.GroupSpec {
	gs := make([]portalloc.GroupSpec, n)
	for i := range gs {
		gs[i] = portalloc.GroupSpec{Name: fmt.Sprintf("g%d", i), Ports: []portalloc.PortSpec{{Name: "p"}}}
	}
	return gs
}

func manyPorts(n int) []portalloc.PortSpec {
	ps := make([]portalloc.PortSpec, n)
	for i := range ps {
		ps[i] = portalloc.PortSpec{Name: fmt.Sprintf("p%d", i)}
	}
	return ps
}

func manyRefs(n int, to string) []portalloc.RefSpec {
	rs := make([]portalloc.RefSpec, n)
	for i := range rs {
		rs[i] = portalloc.RefSpec{Env: fmt.Sprintf("R%d", i), To: to}
	}
	return rs
}

func TestSetSpecValidation(t *testing.T) {
	port := func(name string) portalloc.PortSpec { return portalloc.PortSpec{Name: name} }
	group := func(name string, ps ...portalloc.PortSpec) portalloc.GroupSpec {
		return portalloc.GroupSpec{Name: name, Ports: ps}
	}
	tests := []struct {
		name  string
		spec  portalloc.SetSpec
		field string
		want  string
	}{
		{"no set name", portalloc.SetSpec{Groups: []portalloc.GroupSpec{group("a", port("p"))}}, "name", "empty"},
		{"no groups", portalloc.SetSpec{Name: "s"}, "groups", "at least one group"},
		{"empty group name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("", port("p"))}}, "groups[0].name", "empty"},
		{"duplicate group", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("p")), group("a", port("q"))}}, "groups[1].name", "duplicate group"},
		{"dotted name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a.b", port("p"))}}, "groups[0].name", "'.'"},
		{"numeric name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("0"))}}, "groups[0].ports[0].name", "starts with '0'"},
		{"empty port name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port(""))}}, "groups[0].ports[0].name", "empty"},
		{"duplicate port", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("p"), port("p"))}}, "groups[0].ports[1].name", "duplicate port"},
		{"no ports", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a")}}, "groups[0].ports", "at least one"},
		{"negative members", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: -1, Ports: []portalloc.PortSpec{port("p")}}}}, "groups[0].members", "want 1 to"},
		{"unknown scope", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Scope: "cluster"})}}, "groups[0].ports[0].scope", `"cluster"`},
		{"unknown protocol", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Protocol: "sctp"})}}, "groups[0].ports[0].protocol", `"sctp"`},
		{"duplicate env", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p"}, portalloc.PortSpec{Name: "q", Env: "A_P_PORT"})}}, "groups[0].ports[1].env", "duplicate environment variable"},
		{"env clashes with ref", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "A_P_PORT", To: "a.p"}}}}}, "groups[0].refs[0].env", "duplicate environment variable"},
		{"bad env name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Env: "1X"})}}, "groups[0].ports[0].env", "starts with a digit"},
		{"fixed member port, 2 members", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: 2, Ports: []portalloc.PortSpec{{Name: "p", Port: 25000}}}}}, "groups[0].ports[0].port", "cannot be member-scoped"},
		{"prefer with a fixed port", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Port: 25000, Prefer: []uint16{3000}})}}, "groups[0].ports[0].prefer", "a fixed port is not chosen"},
		{"port 0 preferred", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Prefer: []uint16{3000, 0}})}}, "groups[0].ports[0].prefer", "port 0 is not a port"},
		{"too many preferred", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Prefer: make([]uint16, portalloc.MaxPrefer+1)})}}, "groups[0].ports[0].prefer", "MaxPrefer"},
		{"unknown order", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Order: "highest"})}}, "groups[0].ports[0].order", `"highest"`},
		{"malformed ref", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a"}}}}}, "groups[0].refs[0].to", `want "group.port"`},
		{"dangling group", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "b.p"}}}}}, "groups[0].refs[0].to", `no group "b"`},
		{"dangling port", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a.q"}}}}}, "groups[0].refs[0].to", `has no port "q"`},
		{"dangling member", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: 2, Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a.2.p"}}}}}, "groups[0].refs[0].to", "want 0 to 1"},
		{"ESC in a set name", portalloc.SetSpec{Name: "s\x1b[31m", Groups: []portalloc.GroupSpec{group("a", port("p"))}}, "name", `'\x1b' at byte 1`},
		{"newline in a group name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a\nb", port("p"))}}, "groups[0].name", `'\n' at byte 1`},
		{"NUL in a port name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("p\x00"))}}, "groups[0].ports[0].name", `'\x00' at byte 1`},
		{"invalid UTF-8 in a port name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", port("p\xff"))}}, "groups[0].ports[0].name", `"\xff" at byte 1`},
		{"non-ASCII name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("caf\u00e9", port("p"))}}, "groups[0].name", `'é' at byte 3`},
		{"name too long", portalloc.SetSpec{Name: strings.Repeat("n", portalloc.MaxNameLen+1), Groups: []portalloc.GroupSpec{group("a", port("p"))}}, "name", "it has 65 bytes"},
		{"ESC in an env name", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", portalloc.PortSpec{Name: "p", Env: "X\x1b"})}}, "groups[0].ports[0].env", `'\x1b' at byte 1`},
		{"env name too long", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: strings.Repeat("E", portalloc.MaxEnvNameLen+1), To: "a.p"}}}}}, "groups[0].refs[0].env", "it has 257 bytes"},
		{"too many groups", portalloc.SetSpec{Name: "s", Groups: manyGroups(portalloc.MaxSetGroups + 1)}, "groups", "MaxSetGroups"},
		{"too many members", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: portalloc.MaxGroupMembers + 1, Ports: []portalloc.PortSpec{port("p")}}}}, "groups[0].members", "MaxGroupMembers"},
		{"too many ports in a group", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("a", manyPorts(portalloc.MaxGroupPorts+1)...)}}, "groups[0].ports", "MaxGroupPorts"},
		{"too many refs in a group", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Ports: []portalloc.PortSpec{port("p")}, Refs: manyRefs(portalloc.MaxGroupRefs+1, "a.p")}}}, "groups[0].refs", "MaxGroupRefs"},
		{"too many ports in the set", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{
			{Name: "a", Members: 10000, Ports: manyPorts(6)}, {Name: "b", Members: 5536, Ports: []portalloc.PortSpec{port("p")}},
		}}, "groups[1].ports[0]", "MaxSetPorts"},
		{"too many variables", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{
			{Name: "a", Members: 10000, Ports: []portalloc.PortSpec{{Name: "p", Scope: portalloc.ScopeGroup}}, Refs: manyRefs(200, "a.p")},
		}}, "groups[0]", "MaxSetEnv"},
		{"derived variables of two groups collide", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{group("api", port("http-admin")), group("api-http", port("admin"))}}, "groups[1].ports[0].name", `port "admin" of group "api-http" and port "http-admin" of group "api" would both be $API_HTTP_ADMIN_PORT`},
		{"member port without index", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{{Name: "a", Members: 2, Ports: []portalloc.PortSpec{port("p")}, Refs: []portalloc.RefSpec{{Env: "X", To: "a.p"}}}}}, "groups[0].refs[0].to", `"a.0.p"`},
	}
	for _, tt := range tests {
		err := tt.spec.Validate()
		var se *portalloc.SpecError
		if !errors.As(err, &se) || !errors.Is(err, portalloc.ErrInvalidRequest) || se.Field != tt.field || !strings.Contains(se.Reason, tt.want) {
			t.Errorf("%s: Validate() = %v; want a SpecError for %s saying %q", tt.name, err, tt.field, tt.want)
		}
	}

	// More ports than the range holds: found when allocating.
	base := freeRun(t, 4)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: portalloc.Range{First: base, Last: base + 3}})
	_, err := a.AllocateSet(context.Background(), portalloc.SetSpec{Name: "big", Groups: []portalloc.GroupSpec{{Name: "a", Members: 5, Ports: []portalloc.PortSpec{port("p")}}}})
	if !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), "needs 5 ports") {
		t.Errorf("AllocateSet of 5 members on 4 ports = %v; want ErrInvalidRequest saying it needs 5", err)
	}
}

// TestAllocateSetCheckedBeforeStore: a spec whose variables collide is
// refused before any port is taken, with an error that names both groups,
// both ports and the variable.
func TestAllocateSetCheckedBeforeStore(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	spec := portalloc.SetSpec{Name: "clash", Groups: []portalloc.GroupSpec{
		{Name: "api", Ports: []portalloc.PortSpec{{Name: "http-admin"}, {Name: "grpc"}}},
		{Name: "api-http", Ports: []portalloc.PortSpec{{Name: "web"}, {Name: "admin"}}},
	}}
	_, err := a.AllocateSet(context.Background(), spec)
	var se *portalloc.SpecError
	if !errors.As(err, &se) || se.Field != "groups[1].ports[1].name" {
		t.Fatalf("AllocateSet = %v; want a SpecError for groups[1].ports[1].name", err)
	}
	for _, want := range []string{`"api"`, `"api-http"`, `"http-admin"`, `"admin"`, "$API_HTTP_ADMIN_PORT", "rename"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("AllocateSet = %v; want it to say %s", err, want)
		}
	}
	if got := rowsLabelled(t, a.Config().StateDir, ""); len(got) != 0 {
		t.Errorf("a refused spec took %d ports: %v", len(got), got)
	}
	if st := a.Stats(); st.Allocations != (portalloc.ScopeCounts{}) || st.Errors != (portalloc.ScopeCounts{}) {
		t.Errorf("Stats() = %+v after a refused spec; want no allocation tried", st)
	}
}

// TestValidateOneEnv: the variables of every member must fit one
// environment, for berth run --set; the advice fits the case.
func TestValidateOneEnv(t *testing.T) {
	g := func(name string, members int, ps []portalloc.PortSpec, refs ...portalloc.RefSpec) portalloc.GroupSpec {
		return portalloc.GroupSpec{Name: name, Members: members, Ports: ps, Refs: refs}
	}
	ports := func(ps ...portalloc.PortSpec) []portalloc.PortSpec { return ps }
	tests := []struct {
		name  string
		spec  portalloc.SetSpec
		field string // "" when the spec fits
		want  string
	}{
		{"two groups set PORT", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{
			g("api", 1, ports(portalloc.PortSpec{Name: "http", Env: "PORT"})),
			g("web", 1, ports(portalloc.PortSpec{Name: "http", Env: "PORT"})),
		}}, "groups[1].ports[0]", "$PORT would be port web.http here and port api.http by groups[0].ports[0]; one environment holds one of them: give them different names"},
		{"member port of three members", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{
			g("api", 3, ports(portalloc.PortSpec{Name: "http"})),
		}}, "groups[0].ports[0]", `$API_HTTP_PORT is port "http" of each of the 3 members of group "api"`},
		{"ref and port name one variable, two ports", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{
			g("api", 1, ports(portalloc.PortSpec{Name: "http"}, portalloc.PortSpec{Name: "grpc"})),
			g("web", 1, ports(portalloc.PortSpec{Name: "http"}), portalloc.RefSpec{Env: "API_HTTP_PORT", To: "api.grpc"}),
		}}, "groups[1].refs[0]", "$API_HTTP_PORT would be port api.grpc here and port api.http"},
		{"one member each", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{
			g("api", 1, ports(portalloc.PortSpec{Name: "http"})),
			g("web", 1, ports(portalloc.PortSpec{Name: "http"}), portalloc.RefSpec{Env: "API_HTTP_PORT", To: "api.http"}),
		}}, "", ""},
		{"group port of three members", portalloc.SetSpec{Name: "s", Groups: []portalloc.GroupSpec{
			g("api", 3, ports(portalloc.PortSpec{Name: "grpc", Scope: portalloc.ScopeGroup})),
			g("web", 1, ports(portalloc.PortSpec{Name: "http"}), portalloc.RefSpec{Env: "API_GRPC_PORT", To: "api.grpc"}),
		}}, "", ""},
	}
	for _, tt := range tests {
		if err := tt.spec.Validate(); err != nil {
			t.Fatalf("%s: Validate() = %v; want nil: each member on its own is fine", tt.name, err)
		}
		err := tt.spec.ValidateOneEnv()
		if tt.field == "" {
			if err != nil {
				t.Errorf("%s: ValidateOneEnv() = %v; want nil", tt.name, err)
			}
			continue
		}
		var se *portalloc.SpecError
		if !errors.As(err, &se) || !errors.Is(err, portalloc.ErrInvalidRequest) || se.Field != tt.field || !strings.Contains(se.Reason, tt.want) {
			t.Errorf("%s: ValidateOneEnv() = %v; want a SpecError for %s saying %q", tt.name, err, tt.field, tt.want)
		}
		if strings.Contains(err.Error(), "one member") != strings.Contains(tt.name, "members") {
			t.Errorf("%s: ValidateOneEnv() = %v; advice to give the group one member only fits a group of several", tt.name, err)
		}
	}
}

func TestParseSetSpec(t *testing.T) {
	doc := `{"name":"dev","groups":[
		{"name":"api","members":3,"ports":[{"name":"http"},{"name":"grpc","scope":"group"}]},
		{"name":"web","ports":[{"name":"http","address":"::1","sticky":true}],
		 "refs":[{"env":"API_GRPC","to":"api.grpc"},{"env":"API_PRIMARY_HTTP","to":"api.0.http"}]}]}`
	spec, err := portalloc.ParseSetSpec([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := apiWebSpec()
	want.Groups[1].Ports[0].Address = lo6
	want.Groups[1].Ports[0].Sticky = true
	gotJSON, _ := json.Marshal(spec)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("ParseSetSpec =\n%s\nwant\n%s", gotJSON, wantJSON)
	}
	for _, bad := range []string{`{"name":"x","groups":[{"name":"a","ports":[{"name":"p","scop":"group"}]}]}`, `{"name":`, `[]`, `{"name":"x","groups":[{"name":"a","ports":[{"name":"p"}]}]} {}`} {
		if _, err := portalloc.ParseSetSpec([]byte(bad)); !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("ParseSetSpec(%s) = %v; want ErrInvalidRequest", bad, err)
		}
	}
}

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
	if log.count("sticky port was not free") != 1 {
		t.Errorf("the reason was not logged: %q", log.lines)
	}
	if _, err := b.Allocate(ctx, portalloc.Request{Sticky: true}); !errors.Is(err, portalloc.ErrInvalidRequest) {
		t.Errorf("sticky Allocate without a label = %v; want ErrInvalidRequest", err)
	}
}
