package portalloc_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/berth-go/berth/portalloc"
)

// FuzzParseSetSpec: a set spec from a file never panics the parser, is
// rejected with ErrInvalidRequest, or validates, survives a round trip and
// keeps within every documented limit.
func FuzzParseSetSpec(f *testing.F) {
	f.Add([]byte(`{"name":"dev","groups":[{"name":"api","members":3,"ports":[{"name":"http"},{"name":"grpc","scope":"group"}]},{"name":"web","ports":[{"name":"http"}],"refs":[{"env":"G","to":"api.grpc"},{"env":"H","to":"api.0.http"}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","members":0,"ports":[{"name":"p","port":65535,"protocol":"udp","address":"::1","env":"P","sticky":false}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","ports":[{"name":"p"}],"refs":[{"env":"X","to":"a.9.p"}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","members":10000,"ports":[{"name":"p"},{"name":"q"},{"name":"r"},{"name":"s"},{"name":"t"},{"name":"u"},{"name":"v"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := portalloc.ParseSetSpec(data)
		if err != nil {
			if !errors.Is(err, portalloc.ErrInvalidRequest) {
				t.Fatalf("ParseSetSpec error %v does not wrap ErrInvalidRequest", err)
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

var (
	nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// checkLimits fails t when an accepted spec of size bytes is beyond a
// documented limit.
func checkLimits(t *testing.T, size int, spec portalloc.SetSpec) {
	t.Helper()
	name := func(what, n string) {
		t.Helper()
		if len(n) > portalloc.MaxNameLen || !nameRE.MatchString(n) {
			t.Fatalf("accepted %s %q: want 1 to %d ASCII letters, digits, '_' and '-' starting with a letter", what, n, portalloc.MaxNameLen)
		}
	}
	env := func(e string) {
		t.Helper()
		if len(e) > portalloc.MaxEnvNameLen || !envRE.MatchString(e) {
			t.Fatalf("accepted environment variable name %q", e)
		}
	}
	label := func(l string) {
		t.Helper()
		if len(l) > portalloc.MaxLabelLen || !utf8.ValidString(l) || strings.ContainsFunc(l, func(r rune) bool { return !unicode.IsPrint(r) }) {
			t.Fatalf("accepted spec makes label %q: want at most %d printable bytes", l, portalloc.MaxLabelLen)
		}
	}
	if size > portalloc.MaxSetSpecSize {
		t.Fatalf("accepted %d bytes; MaxSetSpecSize is %d", size, portalloc.MaxSetSpecSize)
	}
	if n := len(spec.Groups); n < 1 || n > portalloc.MaxSetGroups {
		t.Fatalf("accepted %d groups; want 1 to MaxSetGroups (%d)", n, portalloc.MaxSetGroups)
	}
	name("set name", spec.Name)
	ports, vars := 0, 0
	for _, g := range spec.Groups {
		name("group name", g.Name)
		if g.Members < 0 || g.Members > portalloc.MaxGroupMembers || len(g.Ports) > portalloc.MaxGroupPorts || len(g.Refs) > portalloc.MaxGroupRefs {
			t.Fatalf("accepted group %q with %d members, %d ports and %d refs", g.Name, g.Members, len(g.Ports), len(g.Refs))
		}
		members := max(g.Members, 1)
		vars += members * (len(g.Ports) + len(g.Refs))
		for _, p := range g.Ports {
			name("port name", p.Name)
			if p.Env != "" {
				env(p.Env)
			}
			if p.Scope == portalloc.ScopeGroup {
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
	if ports > portalloc.MaxSetPorts || vars > portalloc.MaxSetEnv {
		t.Fatalf("accepted a set of %d ports and %d environment variables; MaxSetPorts is %d, MaxSetEnv %d", ports, vars, portalloc.MaxSetPorts, portalloc.MaxSetEnv)
	}
}
