package portset_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// The limits of a set spec that the package doc states.
const (
	maxSetSpecSize  = 1 << 20
	maxSetGroups    = 10000
	maxGroupMembers = 10000
	maxGroupPorts   = 1000
	maxGroupRefs    = 1000
	maxSetPorts     = 65535
	maxSetEnv       = 1 << 20
)

var (
	lo6    = netip.MustParseAddr("::1")
	nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func manyGroups(n int) []portset.GroupSpec {
	gs := make([]portset.GroupSpec, n)
	for i := range gs {
		gs[i] = portset.GroupSpec{Name: fmt.Sprintf("g%d", i), Ports: []portset.PortSpec{{Name: "p"}}}
	}
	return gs
}

func manyPorts(n int) []portset.PortSpec {
	ps := make([]portset.PortSpec, n)
	for i := range ps {
		ps[i] = portset.PortSpec{Name: fmt.Sprintf("p%d", i)}
	}
	return ps
}

func manyRefs(n int, to string) []portset.RefSpec {
	rs := make([]portset.RefSpec, n)
	for i := range rs {
		rs[i] = portset.RefSpec{Env: fmt.Sprintf("R%d", i), To: to}
	}
	return rs
}

func TestSetSpecValidation(t *testing.T) {
	port := func(name string) portset.PortSpec { return portset.PortSpec{Name: name} }
	group := func(name string, ps ...portset.PortSpec) portset.GroupSpec {
		return portset.GroupSpec{Name: name, Ports: ps}
	}
	tests := []struct {
		name  string
		spec  portset.SetSpec
		field string
		want  string
	}{
		{"no set name", portset.SetSpec{Groups: []portset.GroupSpec{group("a", port("p"))}}, "name", "empty"},
		{"no groups", portset.SetSpec{Name: "s"}, "groups", "at least one group"},
		{"empty group name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("", port("p"))}}, "groups[0].name", "empty"},
		{"duplicate group", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", port("p")), group("a", port("q"))}}, "groups[1].name", "no other group of the set has; groups[0] has it too"},
		{"dotted name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a.b", port("p"))}}, "groups[0].name", "'.'"},
		{"numeric name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", port("0"))}}, "groups[0].ports[0].name", "starts with '0'"},
		{"empty port name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", port(""))}}, "groups[0].ports[0].name", "empty"},
		{"duplicate port", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", port("p"), port("p"))}}, "groups[0].ports[1].name", "no other port of group \"a\" has"},
		{"no ports", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a")}}, "groups[0].ports", "at least one"},
		{"negative members", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Members: -1, Ports: []portset.PortSpec{port("p")}}}}, "groups[0].members", "want 1 to"},
		{"unknown protocol", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p", Protocol: "sctp"})}}, "groups[0].ports[0].protocol", `"sctp"`},
		{"duplicate env", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p"}, portset.PortSpec{Name: "q", Env: "A_P_PORT"})}}, "groups[0].ports[1].env", "no other port or ref of the group sets; groups[0].ports[0].env sets it too"},
		{"env clashes with ref", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Ports: []portset.PortSpec{port("p")}, Refs: []portset.RefSpec{{Env: "A_P_PORT", To: "a.p"}}}}}, "groups[0].refs[0].env", "groups[0].ports[0].env sets it too"},
		{"bad env name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p", Env: "1X"})}}, "groups[0].ports[0].env", "starts with a digit"},
		{"fixed member port, 2 members", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Members: 2, Ports: []portset.PortSpec{{Name: "p", Port: 25000}}}}}, "groups[0].ports[0].port", "cannot be fixed"},
		{"prefer with a fixed port", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p", Port: 25000, Prefer: []uint16{3000}})}}, "groups[0].ports[0].prefer", "none with a fixed port (port 25000)"},
		{"port 0 preferred", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p", Prefer: []uint16{3000, 0}})}}, "groups[0].ports[0].prefer[1]", "want a port from 1 to 65535"},
		{"too many preferred", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p", Prefer: make([]uint16, portalloc.MaxPrefer+1)})}}, "groups[0].ports[0].prefer", "MaxPrefer"},
		{"unknown order", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p", Order: "highest"})}}, "groups[0].ports[0].order", `"highest"`},
		{"malformed ref", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Ports: []portset.PortSpec{port("p")}, Refs: []portset.RefSpec{{Env: "X", To: "a"}}}}}, "groups[0].refs[0].to", `want "group.port"`},
		{"dangling group", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Ports: []portset.PortSpec{port("p")}, Refs: []portset.RefSpec{{Env: "X", To: "b.p"}}}}}, "groups[0].refs[0].to", `no group "b"`},
		{"dangling port", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Ports: []portset.PortSpec{port("p")}, Refs: []portset.RefSpec{{Env: "X", To: "a.q"}}}}}, "groups[0].refs[0].to", `has no port "q"`},
		{"dangling member", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Members: 2, Ports: []portset.PortSpec{port("p")}, Refs: []portset.RefSpec{{Env: "X", To: "a.2.p"}}}}}, "groups[0].refs[0].to", "from 0 to 1"},
		{"ESC in a set name", portset.SetSpec{Name: "s\x1b[31m", Groups: []portset.GroupSpec{group("a", port("p"))}}, "name", `'\x1b' at byte 1`},
		{"newline in a group name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a\nb", port("p"))}}, "groups[0].name", `'\n' at byte 1`},
		{"NUL in a port name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", port("p\x00"))}}, "groups[0].ports[0].name", `'\x00' at byte 1`},
		{"invalid UTF-8 in a port name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", port("p\xff"))}}, "groups[0].ports[0].name", `"\xff" at byte 1`},
		{"non-ASCII name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("caf\u00e9", port("p"))}}, "groups[0].name", `'é' at byte 3`},
		{"name too long", portset.SetSpec{Name: strings.Repeat("n", portset.MaxNameLen+1), Groups: []portset.GroupSpec{group("a", port("p"))}}, "name", "it has 65 bytes"},
		{"ESC in an env name", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", portset.PortSpec{Name: "p", Env: "X\x1b"})}}, "groups[0].ports[0].env", `'\x1b' at byte 1`},
		{"env name too long", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Ports: []portset.PortSpec{port("p")}, Refs: []portset.RefSpec{{Env: strings.Repeat("E", portset.MaxEnvNameLen+1), To: "a.p"}}}}}, "groups[0].refs[0].env", "it has 257 bytes"},
		{"too many groups", portset.SetSpec{Name: "s", Groups: manyGroups(10000 + 1)}, "groups", "at most 10000 groups"},
		{"too many members", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Members: 10000 + 1, Ports: []portset.PortSpec{port("p")}}}}, "groups[0].members", "1 to 10000"},
		{"too many ports in a group", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("a", manyPorts(1000+1)...)}}, "groups[0].ports", "at most 1000 ports"},
		{"too many refs in a group", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Ports: []portset.PortSpec{port("p")}, Refs: manyRefs(1000+1, "a.p")}}}, "groups[0].refs", "at most 1000 refs"},
		{"too many ports in the set", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			{Name: "a", Members: 10000, Ports: manyPorts(6)}, {Name: "b", Members: 5536, Ports: []portset.PortSpec{port("p")}},
		}}, "groups[1].ports[0]", "at most 65535 ports in the set"},
		{"too many variables", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			{Name: "a", Members: 10000, Ports: []portset.PortSpec{{Name: "p", Shared: true}}, Refs: manyRefs(200, "a.p")},
		}}, "groups[0]", "at most 1048576 environment variables"},
		{"derived variables of two groups collide", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{group("api", port("http-admin")), group("api-http", port("admin"))}}, "groups[1].ports[0].name", `port "admin" of group "api-http" and port "http-admin" of group "api" would both be $API_HTTP_ADMIN_PORT`},
		{"member port without index", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{{Name: "a", Members: 2, Ports: []portset.PortSpec{port("p")}, Refs: []portset.RefSpec{{Env: "X", To: "a.p"}}}}}, "groups[0].refs[0].to", `"a.0.p"`},
	}
	for _, tt := range tests {
		err := tt.spec.Validate()
		if !refusedAt(err, tt.field, tt.want) {
			t.Errorf("%s: Validate() = %v; want a *FieldError for SetSpec at %s saying %q", tt.name, err, tt.field, tt.want)
		}
	}

	// More ports than the range holds: found when allocating.
	base := freeRun(t, 4)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: store.Range{First: base, Last: base + 3}})
	_, err := portset.Allocate(context.Background(), a, portset.SetSpec{Name: "big", Groups: []portset.GroupSpec{{Name: "a", Members: 5, Ports: []portset.PortSpec{port("p")}}}})
	if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "needs 5 ports") {
		t.Errorf("AllocateSet of 5 members on 4 ports = %v; want ErrInvalid saying it needs 5", err)
	}
}

// TestValidateOneEnv: the variables of every member must fit one
// environment, for berth run --set; the advice fits the case.
func TestValidateOneEnv(t *testing.T) {
	g := func(name string, members int, ps []portset.PortSpec, refs ...portset.RefSpec) portset.GroupSpec {
		return portset.GroupSpec{Name: name, Members: members, Ports: ps, Refs: refs}
	}
	ports := func(ps ...portset.PortSpec) []portset.PortSpec { return ps }
	tests := []struct {
		name  string
		spec  portset.SetSpec
		field string // "" when the spec fits
		want  string
	}{
		{"two groups set PORT", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			g("api", 1, ports(portset.PortSpec{Name: "http", Env: "PORT"})),
			g("web", 1, ports(portset.PortSpec{Name: "http", Env: "PORT"})),
		}}, "groups[1].ports[0]", "$PORT would be port web.http here and port api.http by groups[0].ports[0]: give them different names"},
		{"member port of three members", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			g("api", 3, ports(portset.PortSpec{Name: "http"})),
		}}, "groups[0].ports[0]", `$API_HTTP_PORT is port "http" of each of the 3 members of group "api"`},
		{"ref and port name one variable, two ports", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			g("api", 1, ports(portset.PortSpec{Name: "http"}, portset.PortSpec{Name: "grpc"})),
			g("web", 1, ports(portset.PortSpec{Name: "http"}), portset.RefSpec{Env: "API_HTTP_PORT", To: "api.grpc"}),
		}}, "groups[1].refs[0]", "$API_HTTP_PORT would be port api.grpc here and port api.http"},
		{"one member each", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			g("api", 1, ports(portset.PortSpec{Name: "http"})),
			g("web", 1, ports(portset.PortSpec{Name: "http"}), portset.RefSpec{Env: "API_HTTP_PORT", To: "api.http"}),
		}}, "", ""},
		{"group port of three members", portset.SetSpec{Name: "s", Groups: []portset.GroupSpec{
			g("api", 3, ports(portset.PortSpec{Name: "grpc", Shared: true})),
			g("web", 1, ports(portset.PortSpec{Name: "http"}), portset.RefSpec{Env: "API_GRPC_PORT", To: "api.grpc"}),
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
		if !refusedAt(err, tt.field, tt.want) {
			t.Errorf("%s: ValidateOneEnv() = %v; want a *FieldError for SetSpec at %s saying %q", tt.name, err, tt.field, tt.want)
		}
		if strings.Contains(err.Error(), "one member") != strings.Contains(tt.name, "members") {
			t.Errorf("%s: ValidateOneEnv() = %v; advice to give the group one member only fits a group of several", tt.name, err)
		}
	}
}

func TestParseSetSpec(t *testing.T) {
	doc := `{"name":"dev","groups":[
		{"name":"api","members":3,"ports":[{"name":"http"},{"name":"grpc","shared":true}]},
		{"name":"web","ports":[{"name":"http","address":"::1","sticky":true}],
		 "refs":[{"env":"API_GRPC","to":"api.grpc"},{"env":"API_PRIMARY_HTTP","to":"api.0.http"}]}]}`
	spec, err := portset.ParseSetSpec([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := apiWebSpec()
	want.Groups[1].Ports[0].Addr = lo6
	want.Groups[1].Ports[0].Sticky = true
	gotJSON, _ := json.Marshal(spec)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("ParseSetSpec =\n%s\nwant\n%s", gotJSON, wantJSON)
	}
	for _, bad := range []string{`{"name":"x","groups":[{"name":"a","ports":[{"name":"p","scop":"group"}]}]}`, `{"name":`, `[]`, `{"name":"x","groups":[{"name":"a","ports":[{"name":"p"}]}]} {}`} {
		if _, err := portset.ParseSetSpec([]byte(bad)); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ParseSetSpec(%s) = %v; want ErrInvalid", bad, err)
		}
	}
}

// FuzzParseSetSpec: a set spec from a file never panics the parser, is
// rejected with ErrInvalid, or validates, survives a round trip and
// keeps within every documented limit.
func FuzzParseSetSpec(f *testing.F) {
	f.Add([]byte(`{"name":"dev","groups":[{"name":"api","members":3,"ports":[{"name":"http"},{"name":"grpc","shared":true}]},{"name":"web","ports":[{"name":"http"}],"refs":[{"env":"G","to":"api.grpc"},{"env":"H","to":"api.0.http"}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","members":0,"ports":[{"name":"p","port":65535,"protocol":"udp","address":"::1","env":"P","sticky":false}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","ports":[{"name":"p"}],"refs":[{"env":"X","to":"a.9.p"}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","members":10000,"ports":[{"name":"p"},{"name":"q"},{"name":"r"},{"name":"s"},{"name":"t"},{"name":"u"},{"name":"v"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := portset.ParseSetSpec(data)
		if err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("ParseSetSpec error %v does not wrap ErrInvalid", err)
			}
			if msg := err.Error(); len(msg) > 1024 || !utf8.ValidString(msg) || strings.ContainsFunc(msg, func(r rune) bool { return !unicode.IsPrint(r) }) {
				t.Fatalf("ParseSetSpec error %q is long or not printable: an error quotes what it refuses escaped and cut", msg)
			}
			return
		}
		if err := spec.Validate(); err != nil {
			t.Fatalf("a parsed spec does not validate: %v", err)
		}
		checkLimits(t, len(data), spec)
	})
}

// checkLimits fails t when an accepted spec of size bytes is beyond a
// documented limit.
func checkLimits(t *testing.T, size int, spec portset.SetSpec) {
	t.Helper()
	name := func(what, n string) {
		t.Helper()
		if len(n) > portset.MaxNameLen || !nameRE.MatchString(n) {
			t.Fatalf("accepted %s %q: want 1 to %d ASCII letters, digits, '_' and '-' starting with a letter", what, n, portset.MaxNameLen)
		}
	}
	env := func(e string) {
		t.Helper()
		if len(e) > portset.MaxEnvNameLen || !envRE.MatchString(e) {
			t.Fatalf("accepted environment variable name %q", e)
		}
	}
	label := func(l string) {
		t.Helper()
		if len(l) > store.MaxLabelLen || !utf8.ValidString(l) || strings.ContainsFunc(l, func(r rune) bool { return !unicode.IsPrint(r) }) {
			t.Fatalf("accepted spec makes label %q: want at most %d printable bytes", l, store.MaxLabelLen)
		}
	}
	if size > maxSetSpecSize {
		t.Fatalf("accepted %d bytes; maxSetSpecSize is %d", size, maxSetSpecSize)
	}
	if n := len(spec.Groups); n < 1 || n > maxSetGroups {
		t.Fatalf("accepted %d groups; want 1 to maxSetGroups (%d)", n, maxSetGroups)
	}
	name("set name", spec.Name)
	ports, vars := 0, 0
	for _, g := range spec.Groups {
		name("group name", g.Name)
		if g.Members < 0 || g.Members > maxGroupMembers || len(g.Ports) > maxGroupPorts || len(g.Refs) > maxGroupRefs {
			t.Fatalf("accepted group %q with %d members, %d ports and %d refs", g.Name, g.Members, len(g.Ports), len(g.Refs))
		}
		members := max(g.Members, 1)
		vars += members * (len(g.Ports) + len(g.Refs))
		for _, p := range g.Ports {
			name("port name", p.Name)
			if p.Env != "" {
				env(p.Env)
			}
			if p.Shared {
				ports++
				label(spec.Name + "/" + g.Name + "/" + p.Name)
			} else {
				ports += members
				label(fmt.Sprintf("%s/%s/%d/%s", spec.Name, g.Name, members-1, p.Name))
			}
		}
		for _, r := range g.Refs {
			env(r.Env)
		}
	}
	if ports > maxSetPorts || vars > maxSetEnv {
		t.Fatalf("accepted a set of %d ports and %d environment variables; maxSetPorts is %d, maxSetEnv %d", ports, vars, maxSetPorts, maxSetEnv)
	}
}

// apiWebSpec is the set of the issue: api with 3 members, each with its own
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

// refusedAt reports whether err is a refused spec as every call of the
// package returns one: a *store.FieldError for SetSpec at the path at,
// with a Want, wrapping store.ErrInvalid, whose message has
// the package's prefix once and says want.
func refusedAt(err error, at, want string) bool {
	var fe *store.FieldError
	return errors.As(err, &fe) && fe.Field == "SetSpec" && fe.At == at && fe.Want != "" &&
		errors.Is(err, store.ErrInvalid) && strings.Count(err.Error(), "portalloc: ") == 1 &&
		strings.HasPrefix(err.Error(), "portalloc: ") && strings.Contains(err.Error(), want)
}
