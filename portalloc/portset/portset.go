// Package portset reserves the named ports of a set of processes that must
// find each other, all of them or none, and gives each member its
// environment: groups of members (api with 3 replicas, db with 1), each
// with named ports, and variables that carry other groups' ports.
//
// A set's ports are reservations of an Allocator (package portalloc), held
// by the set under its name: a row stays reserved until every set,
// Allocator and pool of the process that holds it has released it.
//
// # Variables
//
// Each member gets one variable per port of its group,
// <GROUP>_<PORT>_PORT (upper case, '-' as '_') unless PortSpec.Env names
// it, and one per reference, named by its RefSpec.Env exactly (see
// GroupSpec.EnvNames). A spec is checked whole before any port is taken;
// SetSpec.ValidateOneEnv also checks that all members' variables fit one
// environment.
//
// # After the Allocator's Close
//
// Allocate returns an error wrapping store.ErrClosed, and so do
// Set.Transfer and Set.TransferAll for a port the set still holds.
// Set.Release returns nil, as it does when there is
// nothing left to release: Close has already released what the set held.
// What only reads what a set already has stays valid: Set.Members,
// Set.Member, Set.Manifest, Set.WriteManifest and Member.Env.
package portset

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/names"
	"github.com/berth-go/berth/store"
)

// specField is the Field of every refused spec: At says where in it.
const specField = "SetSpec"

// refuse refuses value at the path at in a spec, saying what is accepted.
func refuse(at, value, want string) error {
	return &store.FieldError{Field: specField, Value: value, At: at, Want: want}
}

// portList writes ports as a spec's JSON list would hold them: "3000,3001".
func portList(ports []uint16) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

// opError wraps err in a *portalloc.OpError for op, the one place the
// package's calls add the prefix. nil stays nil.
func opError(op string, err error) error {
	if err == nil {
		return nil
	}
	// An error of the Allocator's has its prefix already: one is enough.
	if oe, ok := err.(*portalloc.OpError); ok { //nolint:errorlint // only an OpError at the top, not one wrapped deeper
		err = oe.Err
	}
	return &portalloc.OpError{Op: op, Err: err}
}

// SetSpec describes the ports of a set of processes that must find each
// other: groups of members (api with 3 replicas, db with 1), each with named
// ports, and environment variables that carry other groups' ports.
//
// A spec can be written as Go values or loaded from JSON with ParseSetSpec;
// its JSON field names are the lower-case ones shown in the struct tags.
type SetSpec struct {
	// Name distinguishes sets in listings and labels: each port is
	// labelled "<set>/<group>/<member>/<port>" (a port of each member) or
	// "<set>/<group>/<port>" (a shared port).
	Name   string      `json:"name"`
	Groups []GroupSpec `json:"groups"`
}

// GroupSpec is one group of a set.
type GroupSpec struct {
	Name string `json:"name"`
	// Members is the number of processes of the group; zero: 1.
	Members int        `json:"members,omitempty"`
	Ports   []PortSpec `json:"ports"`
	// Refs sets environment variables of every member to ports of any
	// group of the set, this one included.
	Refs []RefSpec `json:"refs,omitempty"`
}

// PortSpec is one named port of a group.
type PortSpec struct {
	Name string `json:"name"`
	// Shared makes one port for the whole group, shared by every member
	// (a proxy's, a leader's); false (the zero value): each member gets a
	// port of its own.
	Shared   bool           `json:"shared,omitempty"`
	Protocol store.Protocol `json:"protocol,omitempty"` // zero: TCP
	// Addr is the address the port is for; zero: 127.0.0.1.
	Addr netip.Addr `json:"address,omitzero"`
	// Port fixes the port number instead of allocating one; it is then
	// reserved with Reserve. A per-member fixed port needs a group of
	// one member.
	Port uint16 `json:"port,omitempty"`
	// Env overrides the variable name, "<GROUP>_<PORT>_PORT" by default
	// (upper case, '-' as '_'). Two groups may not derive the same default
	// (groups "api" and "api-http" with ports "http-admin" and "admin"
	// would both make API_HTTP_ADMIN_PORT), but may give the same Env, since
	// each member gets only its own group's variables (see ValidateOneEnv).
	Env string `json:"env,omitempty"`
	// Sticky asks for the port this entry had last time (see
	// portalloc.Request.Sticky).
	Sticky bool `json:"sticky,omitempty"`
	// Prefer and Order are portalloc.Request.Prefer and portalloc.Request.Order for this
	// port: ports to try first (the first free one is taken, each member
	// of a per-member port taking the next), then the range in this
	// order. Not with a fixed Port.
	Prefer []uint16        `json:"prefer,omitempty"`
	Order  portalloc.Order `json:"order,omitempty"`
}

// RefSpec sets Env to another port of the set: To is "group.port" for a
// shared port (or a port of a group of one member), or
// "group.N.port" for member N's port of a per-member one. The variable
// is named Env exactly: nothing is added to it (Env "API_GRPC" gives
// API_GRPC=<port>, not API_GRPC_PORT).
type RefSpec struct {
	Env string `json:"env"`
	To  string `json:"to"`
}

// Limits of the names a SetSpec gives, in bytes.
const (
	// MaxNameLen is the longest set, group, port or pool name, in bytes.
	// A name is 1 to MaxNameLen ASCII letters, digits, '_' and '-',
	// starting with a letter: names are joined with '/' and '.' into
	// labels and references, and upper-cased (with '-' as '_') into
	// environment variable names, so they hold neither separator, are
	// never read as a member index, and always make a valid variable
	// name. The longest set label, "set/group/9999/port", stays within
	// store.MaxLabelLen.
	MaxNameLen = names.MaxLen
	// MaxEnvNameLen is the longest environment variable name a SetSpec
	// names itself (PortSpec.Env, RefSpec.Env), in bytes: ASCII letters,
	// digits and '_', not starting with a digit. Derived names,
	// "<GROUP>_<PORT>_PORT", have at most 2*MaxNameLen+6 bytes.
	MaxEnvNameLen = names.MaxEnvLen
)

// Limits of a SetSpec, which bound the work and memory a spec from a file
// can cost (parsing and validating take time and memory linear in its
// size): a JSON document of at most 1 MiB; at most 10000 groups, each of at
// most 10000 members, 1000 ports and 1000 refs; at most 65535 ports in a
// set (a shared port counts once, a per-member one once per member) and
// 2^20 environment variables of all members together (one per port and ref
// of a member's group). ParseSetSpec, Validate and Allocate refuse a spec
// beyond one of them with a *store.FieldError that says which.
const (
	maxSetSpecSize  = 1 << 20
	maxSetGroups    = 10000
	maxGroupMembers = 10000
	maxGroupPorts   = 1000
	maxGroupRefs    = 1000
	maxSetPorts     = 65535
	maxSetEnv       = 1 << 20
)

// specLimits are the limits a validation applies; the benchmarks lift
// them to show how validation grows beyond them.
type specLimits struct {
	size, groups, members, groupPorts, groupRefs, ports, env int
}

var setLimits = specLimits{
	size: maxSetSpecSize, groups: maxSetGroups, members: maxGroupMembers,
	groupPorts: maxGroupPorts, groupRefs: maxGroupRefs, ports: maxSetPorts, env: maxSetEnv,
}

// ParseSetSpec parses and validates a JSON SetSpec of at most 1 MiB. Unknown fields are errors, so a misspelt key does
// not pass silently. A refused spec is a *store.FieldError for the
// Field "SetSpec", At the path into it that went wrong
// ("groups[1].ports[0].name"), in a *portalloc.OpError; both wrap
// store.ErrInvalid.
func ParseSetSpec(data []byte) (SetSpec, error) {
	s, err := parseSetSpec(data, setLimits)
	return s, opError("", err)
}

func parseSetSpec(data []byte, lim specLimits) (SetSpec, error) {
	if len(data) > lim.size {
		return SetSpec{}, refuse("", fmt.Sprintf("%d bytes", len(data)), fmt.Sprintf("a JSON document of at most %d bytes (1 MiB)", lim.size))
	}
	var s SetSpec
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return SetSpec{}, refuse(jsonAt(err), string(data), "the JSON of a SetSpec; "+err.Error())
	}
	if dec.More() {
		return SetSpec{}, refuse(fmt.Sprintf("byte %d", dec.InputOffset()), string(data), "one JSON value; there is more after it")
	}
	if _, err := s.index(lim); err != nil {
		return SetSpec{}, err
	}
	return s, nil
}

// Validate checks the spec on its own, within the limits above;
// Allocate also checks that the range can hold it. Errors are
// ParseSetSpec's.
func (s SetSpec) Validate() error {
	_, err := s.index(setLimits)
	return opError("", err)
}

// jsonAt says where the decoder's err went wrong, as FieldError.At: the
// key's path for a value of the wrong type, else the byte offset if known.
func jsonAt(err error) string {
	var (
		te *json.UnmarshalTypeError
		se *json.SyntaxError
	)
	switch {
	case errors.As(err, &te) && te.Field != "":
		return te.Field
	case errors.As(err, &te):
		return fmt.Sprintf("byte %d", te.Offset)
	case errors.As(err, &se):
		return fmt.Sprintf("byte %d", se.Offset)
	}
	return ""
}

// ValidateOneEnv checks the spec as Validate does, and that the variables
// of all its members can be put in one environment together, as berth run
// --set gives them to one command: each variable must stand for one port
// wherever it is set. So two groups may not set one variable to different
// ports (both with Env "PORT", say), nor may a per-member port of a group
// of several members have one. A spec whose members each run as a process
// of their own, with their own Member.Env, needs only Validate. Errors are
// ParseSetSpec's.
func (s SetSpec) ValidateOneEnv() error { return opError("", s.validateOneEnv()) }

func (s SetSpec) validateOneEnv() error {
	ix, err := s.index(setLimits)
	if err != nil {
		return err
	}
	type source struct {
		to    portRef
		field string
	}
	seen := map[string]source{}
	// show names a port as a reference may: "api.http" in a group of one.
	show := func(r portRef) string {
		if r.member == 0 && members(s.Groups[ix.groups[r.group]]) == 1 {
			r.member = -1
		}
		return r.String()
	}
	for gi, g := range s.Groups {
		n := members(g)
		check := func(name string, to portRef, field string) error {
			prev, dup := seen[name]
			if !dup {
				seen[name] = source{to, field}
				return nil
			}
			if prev.to == to {
				return nil
			}
			return refuse(field, name, fmt.Sprintf("a variable that stands for one port in one environment; $%s would be port %s here and port %s by %s: give them different names", name, show(to), show(prev.to), prev.field))
		}
		for pi, p := range g.Ports {
			field := fmt.Sprintf("groups[%d].ports[%d]", gi, pi)
			name := envName(g, p)
			if p.Shared {
				if err := check(name, portRef{g.Name, p.Name, -1}, field); err != nil {
					return err
				}
				continue
			}
			if n > 1 {
				return refuse(field, name, fmt.Sprintf("a variable that stands for one port in one environment; $%s is port %q of each of the %d members of group %q, a different port for each: make the port shared, or give the group one member", name, p.Name, n, g.Name))
			}
			if err := check(name, portRef{g.Name, p.Name, 0}, field); err != nil {
				return err
			}
		}
		for ri, r := range g.Refs {
			if err := check(r.Env, ix.refs[gi][ri], fmt.Sprintf("groups[%d].refs[%d]", gi, ri)); err != nil {
				return err
			}
		}
	}
	return nil
}

// EnvNames returns the names of the variables each member of g gets, in the
// order of Member.Env: one per port, "<GROUP>_<PORT>_PORT" unless its Env
// says otherwise, then one per reference, its Env.
func (g GroupSpec) EnvNames() []string {
	out := make([]string, 0, len(g.Ports)+len(g.Refs))
	for _, p := range g.Ports {
		out = append(out, envName(g, p))
	}
	for _, r := range g.Refs {
		out = append(out, r.Env)
	}
	return out
}

// specIndex is a validated spec's lookup tables: a reference costs two map
// lookups, where searching the groups for each took quadratic time.
type specIndex struct {
	groups map[string]int  // group index by name
	ports  map[portKey]int // port index by group index and port name
	refs   [][]portRef     // each group's references, resolved
	need   int             // ports the set needs from the range
}

type portKey struct {
	group int
	name  string
}

type envKey struct {
	group int
	name  string
}

// index validates s within lim and returns its lookup tables, in time and
// memory linear in the size of s (field names are made only for an error).
func (s SetSpec) index(lim specLimits) (*specIndex, error) {
	if why := names.Problem(s.Name); why != "" {
		return nil, refuse("name", s.Name, names.Want+"; "+why)
	}
	switch {
	case len(s.Groups) == 0:
		return nil, refuse("groups", "0 groups", "at least one group")
	case len(s.Groups) > lim.groups:
		return nil, refuse("groups", fmt.Sprintf("%d groups", len(s.Groups)), fmt.Sprintf("at most %d groups", lim.groups))
	}
	// Size the tables once (capped: the counts are checked below).
	nports, nrefs := 0, 0
	for _, g := range s.Groups {
		nports += min(len(g.Ports), lim.groupPorts)
		nrefs += min(len(g.Refs), lim.groupRefs)
	}
	ix := &specIndex{
		groups: make(map[string]int, len(s.Groups)),
		ports:  make(map[portKey]int, nports),
		refs:   make([][]portRef, len(s.Groups)),
	}
	// envs maps each group's variables to who sets them: a port's index,
	// or -1-i for reference i.
	envs := make(map[envKey]int, nports+nrefs)
	// derived maps each derived variable to its port: such a name stands
	// for one port of the set (see PortSpec.Env).
	derived := make(map[string]portKey, nports)
	envField := func(gi, who int) string {
		if who >= 0 {
			return fmt.Sprintf("groups[%d].ports[%d].env", gi, who)
		}
		return fmt.Sprintf("groups[%d].refs[%d].env", gi, -1-who)
	}
	useEnv := func(gi, who int, name string, explicit bool) error {
		if explicit || who < 0 {
			if why := names.EnvProblem(name); why != "" {
				return refuse(envField(gi, who), name, names.EnvWant+"; "+why)
			}
		}
		k := envKey{gi, name}
		if prev, dup := envs[k]; dup {
			return refuse(envField(gi, who), name, fmt.Sprintf("a variable no other port or ref of the group sets; %s sets it too", envField(gi, prev)))
		}
		envs[k] = who
		return nil
	}
	ports, env := 0, 0
	for gi, g := range s.Groups {
		gf := func() string { return fmt.Sprintf("groups[%d]", gi) }
		if why := names.Problem(g.Name); why != "" {
			return nil, refuse(gf()+".name", g.Name, names.Want+"; "+why)
		}
		if prev, dup := ix.groups[g.Name]; dup {
			return nil, refuse(gf()+".name", g.Name, fmt.Sprintf("a name no other group of the set has; groups[%d] has it too", prev))
		}
		ix.groups[g.Name] = gi
		switch {
		case g.Members < 0 || g.Members > lim.members:
			return nil, refuse(gf()+".members", strconv.Itoa(g.Members), fmt.Sprintf("1 to %d (0 means 1)", lim.members))
		case len(g.Ports) == 0 && len(g.Refs) == 0:
			return nil, refuse(gf()+".ports", "0 ports", "at least one port or ref")
		case len(g.Ports) > lim.groupPorts:
			return nil, refuse(gf()+".ports", fmt.Sprintf("%d ports", len(g.Ports)), fmt.Sprintf("at most %d ports", lim.groupPorts))
		case len(g.Refs) > lim.groupRefs:
			return nil, refuse(gf()+".refs", fmt.Sprintf("%d refs", len(g.Refs)), fmt.Sprintf("at most %d refs", lim.groupRefs))
		}
		n := members(g)
		if env += n * (len(g.Ports) + len(g.Refs)); env > lim.env {
			return nil, refuse(gf(), fmt.Sprintf("%d members", n), fmt.Sprintf("at most %d environment variables of the set's members together (one per port and ref of a member's group); this group brings them to %d", lim.env, env))
		}
		for pi, p := range g.Ports {
			pf := func() string { return fmt.Sprintf("%s.ports[%d]", gf(), pi) }
			if why := names.Problem(p.Name); why != "" {
				return nil, refuse(pf()+".name", p.Name, names.Want+"; "+why)
			}
			pk := portKey{gi, p.Name}
			if _, dup := ix.ports[pk]; dup {
				return nil, refuse(pf()+".name", p.Name, fmt.Sprintf("a name no other port of group %q has; ports[%d] has it too", g.Name, ix.ports[pk]))
			}
			ix.ports[pk] = pi
			switch p.Protocol {
			case "", store.TCP, store.UDP:
			default:
				return nil, refuse(pf()+".protocol", string(p.Protocol), `"tcp" or "udp"`)
			}
			if p.Addr.IsValid() && p.Addr.Zone() != "" {
				return nil, refuse(pf()+".address", p.Addr.String(), "an address without a zone; zoned IPv6 addresses are not supported")
			}
			if p.Port != 0 && !p.Shared && n > 1 {
				return nil, refuse(pf()+".port", strconv.Itoa(int(p.Port)), fmt.Sprintf("0, or a shared port: a port of each member of a group of %d members cannot be fixed (they cannot all have it)", n))
			}
			if p.Port != 0 && len(p.Prefer) > 0 {
				return nil, refuse(pf()+".prefer", portList(p.Prefer), fmt.Sprintf("none with a fixed port (port %d), which is not chosen: prefer and order are for allocated ports", p.Port))
			}
			if p.Port != 0 && p.Order != "" {
				return nil, refuse(pf()+".order", string(p.Order), fmt.Sprintf("none with a fixed port (port %d), which is not chosen: prefer and order are for allocated ports", p.Port))
			}
			if len(p.Prefer) > portalloc.MaxPrefer {
				return nil, refuse(pf()+".prefer", fmt.Sprintf("%d ports", len(p.Prefer)), fmt.Sprintf("at most %d ports (MaxPrefer)", portalloc.MaxPrefer))
			}
			if i := slices.Index(p.Prefer, 0); i >= 0 {
				return nil, refuse(fmt.Sprintf("%s.prefer[%d]", pf(), i), "0", "a port from 1 to 65535")
			}
			switch p.Order {
			case "", portalloc.OrderRandom, portalloc.OrderLowest:
			default:
				return nil, refuse(pf()+".order", string(p.Order), fmt.Sprintf("%q or %q", portalloc.OrderRandom, portalloc.OrderLowest))
			}
			if p.Sticky && p.Port != 0 {
				return nil, refuse(pf()+".sticky", "true", fmt.Sprintf("false with a fixed port (port %d), which is always the same: sticky is for allocated ports", p.Port))
			}
			k := n
			if p.Shared {
				k = 1
			}
			if ports += k; ports > lim.ports {
				return nil, refuse(pf(), p.Name, fmt.Sprintf("at most %d ports in the set (a shared port counts once, a per-member one once per member); this port brings them to %d", lim.ports, ports))
			}
			if p.Port == 0 {
				ix.need += k
			}
			name := envName(g, p)
			if err := useEnv(gi, pi, name, p.Env != ""); err != nil {
				return nil, err
			}
			if p.Env == "" {
				if prev, dup := derived[name]; dup && prev.group != gi {
					pg := &s.Groups[prev.group]
					return nil, refuse(pf()+".name", p.Name, fmt.Sprintf("a name whose variable no port of another group makes (a variable is <GROUP>_<PORT>_PORT, with '-' as '_'); port %q of group %q and port %q of group %q would both be $%s: rename one of the groups or ports, or set env on one of them", p.Name, g.Name, pg.Ports[ix.ports[prev]].Name, pg.Name, name))
				}
				derived[name] = portKey{gi, p.Name}
			}
		}
		for ri, r := range g.Refs {
			if err := useEnv(gi, -1-ri, r.Env, true); err != nil {
				return nil, err
			}
		}
	}
	// References point at ports of any group, never at other references (so
	// no cycles): they are resolved once every group is indexed.
	for gi, g := range s.Groups {
		if len(g.Refs) == 0 {
			continue
		}
		ix.refs[gi] = make([]portRef, len(g.Refs))
		for ri, r := range g.Refs {
			pr, want := s.resolveRef(ix, r.To)
			if want != "" {
				return nil, refuse(fmt.Sprintf("groups[%d].refs[%d].to", gi, ri), r.To, want)
			}
			ix.refs[gi][ri] = pr
		}
	}
	return ix, nil
}

func members(g GroupSpec) int { return max(g.Members, 1) }

// envName is the variable a port is exported as.
func envName(g GroupSpec, p PortSpec) string {
	if p.Env != "" {
		return p.Env
	}
	up := func(s string) string {
		return strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z':
				return r - 'a' + 'A'
			case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
				return r
			}
			return '_'
		}, s)
	}
	return up(g.Name) + "_" + up(p.Name) + "_PORT"
}

// portRef is a resolved reference: a group's port, and its member if per member.
type portRef struct {
	group, port string
	member      int // -1 for shared ports
}

// String names the port as a reference would: "api.grpc", "api.0.http".
func (r portRef) String() string {
	if r.member < 0 {
		return r.group + "." + r.port
	}
	return r.group + "." + strconv.Itoa(r.member) + "." + r.port
}

// resolveRef resolves a reference with ix. It returns what a reference may
// be, for FieldError.Want, when to names no port of the set.
func (s SetSpec) resolveRef(ix *specIndex, to string) (portRef, string) {
	gname, rest, ok := strings.Cut(to, ".")
	if !ok {
		return portRef{}, refForm
	}
	mstr, name, three := strings.Cut(rest, ".")
	if !three {
		mstr, name = "", rest
	} else if strings.Contains(name, ".") {
		return portRef{}, refForm
	}
	gi, ok := ix.groups[gname]
	if !ok {
		return portRef{}, refForm + "; the set has no group " + names.QuoteShort(gname)
	}
	g := &s.Groups[gi]
	pi, ok := ix.ports[portKey{gi, name}]
	if !ok {
		return portRef{}, fmt.Sprintf("%s; group %q has no port %s", refForm, g.Name, names.QuoteShort(name))
	}
	p := &g.Ports[pi]
	if !three {
		switch {
		case p.Shared:
			return portRef{g.Name, p.Name, -1}, ""
		case members(*g) == 1:
			return portRef{g.Name, p.Name, 0}, ""
		}
		return portRef{}, fmt.Sprintf("\"group.member.port\" for a port per member, e.g. \"%s.0.%s\"; port %q of group %q is per member and the group has %d members", g.Name, p.Name, p.Name, g.Name, members(*g))
	}
	m, err := strconv.Atoi(mstr)
	if err != nil || m < 0 || m >= members(*g) {
		return portRef{}, fmt.Sprintf("a member of group %q from 0 to %d; it names member %s", g.Name, members(*g)-1, names.QuoteShort(mstr))
	}
	if p.Shared {
		return portRef{g.Name, p.Name, -1}, "" // the same port for every member
	}
	return portRef{g.Name, p.Name, m}, ""
}

// refForm is what a reference's To may be.
const refForm = `"group.port" or "group.member.port" naming a port of the set`

// Set is an allocated SetSpec. It is safe for concurrent use only for
// reading; Release and Transfer must not run concurrently.
type Set struct {
	Name    string
	members []*Member
	byName  map[memberKey]*Member
	a       *portalloc.Allocator
	held    map[string]store.Reservation // what the set still holds, by label
}

type memberKey struct {
	group string
	index int
}

// Member is one member of a group with its ports.
type Member struct {
	Group string
	Index int
	// Ports are the member's ports by name: its own and its group's shared
	// ones.
	Ports  map[string]store.Reservation
	shared map[string]bool // the group's shared ports, by name
	env    []string
	set    *Set
}

// Env returns the member's environment variables as KEY=VALUE strings, ready
// to append to exec.Cmd.Env: one per port of its group and one per ref.
func (m *Member) Env() []string { return append([]string(nil), m.env...) }

// Files returns copies of the descriptors that hold the kernel locks of
// the member's own ports (not its group's shared ones), for the member's
// process to inherit when it starts (exec.Cmd.ExtraFiles): Transfer then
// finds the locks held by that process and needs no keeper for them (see
// portalloc.Allocator.Files). The caller closes them once the process has
// started.
func (m *Member) Files() ([]*os.File, error) {
	var out []*os.File
	for name, r := range m.Ports {
		if m.shared[name] {
			continue
		}
		fs, err := m.set.a.Files(r)
		if err != nil {
			for _, f := range out {
				_ = f.Close()
			}
			return nil, err
		}
		out = append(out, fs...)
	}
	return out, nil
}

// Members returns every member, in spec order.
func (s *Set) Members() []*Member { return s.members }

// Member returns member index of group. A group the set does not have, or
// an index outside 0 to the group's members less one, is a
// *store.FieldError for "group" or "index" that says what the set has; the
// member is then nil.
func (s *Set) Member(group string, index int) (*Member, error) {
	if m := s.byName[memberKey{group, index}]; m != nil {
		return m, nil
	}
	n := 0
	for i := 0; s.byName[memberKey{group, i}] != nil; i++ {
		n = i + 1
	}
	op := fmt.Sprintf("get member %d of group %s of set %q", index, names.QuoteShort(group), s.Name)
	if n == 0 {
		return nil, opError(op, &store.FieldError{Field: "group", Value: group, Want: fmt.Sprintf("a group of set %q", s.Name)})
	}
	return nil, opError(op, &store.FieldError{Field: "index", Value: strconv.Itoa(index), Want: fmt.Sprintf("0 to %d, a member of group %q", n-1, group)})
}

func label(set, group string, member int, port string) string {
	if member < 0 {
		return set + "/" + group + "/" + port
	}
	return set + "/" + group + "/" + strconv.Itoa(member) + "/" + port
}

// Allocate reserves every port of spec with a, or none: when one cannot be
// had, the holds taken so far are dropped. Allocating a spec again from the
// same Allocator returns the ports it holds for it already, each with one
// more hold, taken by the new Set: a port stays reserved until every Set,
// pool and Reserve of the process that holds it has released it.
func Allocate(ctx context.Context, a *portalloc.Allocator, spec SetSpec) (_ *Set, err error) {
	defer func() { err = opError(fmt.Sprintf("allocate set %s", names.QuoteShort(spec.Name)), err) }()
	select {
	case <-a.Done():
		return nil, store.ErrClosed
	default:
	}
	ix, err := spec.index(setLimits)
	if err != nil {
		return nil, err
	}
	if n := a.Stats().Ports; ix.need > n {
		return nil, refuse("groups", fmt.Sprintf("%d ports", ix.need), fmt.Sprintf("a set that needs at most the %d ports %s has to hand out; it needs %d ports allocated from the range", n, a.Config().Range, ix.need))
	}
	// What the Allocator holds for this spec already, by recorded label.
	existing := map[string]store.Reservation{}
	for _, r := range a.Held() {
		if strings.HasPrefix(r.Label, spec.Name+"/") {
			existing[r.Label] = r
		}
	}
	scope := a.Config().Scope
	s := &Set{Name: spec.Name, a: a, held: map[string]store.Reservation{}, byName: map[memberKey]*Member{}}
	var taken []store.Reservation // the holds of this call, dropped if a later port fails
	obtain := func(g GroupSpec, p PortSpec, member int) (store.Reservation, error) {
		req := portalloc.Request{Protocol: p.Protocol, Addr: p.Addr, Label: label(spec.Name, g.Name, member, p.Name), Sticky: p.Sticky, Prefer: p.Prefer, Order: p.Order}
		if req.Protocol == "" {
			req.Protocol = store.TCP
		}
		if !req.Addr.IsValid() {
			req.Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
		port := p.Port
		recorded := req.Label
		if scope != "" {
			recorded += "@" + scope
		}
		if r, ok := existing[recorded]; ok && r.Protocol == req.Protocol && r.Addr == req.Addr.Unmap() && (port == 0 || r.Port == port) {
			port = r.Port // one more hold of what the Allocator has
		}
		var r store.Reservation
		var err error
		if port != 0 {
			r, err = a.Reserve(ctx, req, port)
		} else {
			r, err = a.Allocate(ctx, req)
		}
		if err == nil {
			taken = append(taken, r)
		}
		return r, err
	}
	fail := func(err error) (*Set, error) {
		for _, r := range taken {
			_ = a.Release(ctx, r) // for logging only: reaping covers a failure
		}
		return nil, err
	}
	byRef := map[portRef]store.Reservation{}
	for _, g := range spec.Groups {
		var group []*Member
		for i := range members(g) {
			m := &Member{Group: g.Name, Index: i, Ports: map[string]store.Reservation{}, shared: map[string]bool{}, set: s}
			group = append(group, m)
			s.byName[memberKey{g.Name, i}] = m
		}
		for _, p := range g.Ports {
			for _, m := range group {
				ref := portRef{g.Name, p.Name, m.Index}
				if p.Shared {
					ref.member = -1
				}
				r, ok := byRef[ref] // a shared port is taken for the first member
				if !ok {
					var err error
					if r, err = obtain(g, p, ref.member); err != nil {
						return fail(err)
					}
					s.held[r.Label] = r
					byRef[ref] = r
				}
				m.Ports[p.Name], m.shared[p.Name] = r, p.Shared
			}
		}
		s.members = append(s.members, group...)
	}
	// Environments, once every port is known; members are in spec order.
	mi := 0
	for gi, g := range spec.Groups {
		for range members(g) {
			m := s.members[mi]
			mi++
			for _, p := range g.Ports {
				m.env = append(m.env, envName(g, p)+"="+strconv.Itoa(int(m.Ports[p.Name].Port)))
			}
			for ri, ref := range g.Refs {
				m.env = append(m.env, ref.Env+"="+strconv.Itoa(int(byRef[ix.refs[gi][ri]].Port)))
			}
		}
	}
	return s, nil
}

// Release drops the set's hold of every port it still holds, as
// portalloc.Allocator.Release does (going on when ctx is cancelled, so a
// deferred Release at shutdown still releases). It is nil when there is
// nothing left, and a port already released is not an error; other errors
// are for logging, since reaping covers a failed release. Ports handed to
// other processes (Transfer, TransferAll) are theirs, reaped once they exit.
func (s *Set) Release(ctx context.Context) error {
	var errs []error
	for l, r := range s.held {
		if err := s.a.Release(ctx, r); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrClosed) {
			errs = append(errs, err)
		}
		delete(s.held, l)
	}
	return opError(fmt.Sprintf("release set %q", s.Name), errors.Join(errs...))
}

// Transfer hands m's own ports to the running process pid, the child the
// caller started for m, so they stay reserved exactly as long as it runs,
// even if the caller dies first (see portalloc.Allocator.Transfer). Shared
// ports stay with the caller. Like Allocator.Transfer it refuses a port
// that something else in this process holds too.
//
// m must be a member of s, as Members or Member return it: a nil member or
// one of another set is refused with a *store.FieldError for "m", and
// nothing is transferred.
func (s *Set) Transfer(ctx context.Context, m *Member, pid int) error {
	op := fmt.Sprintf("transfer a member of set %q to pid %d", s.Name, pid)
	switch {
	case m == nil:
		return opError(op, &store.FieldError{Field: "m", Value: "nil", Want: "one of the set's Members"})
	case m.set != s:
		return opError(op, &store.FieldError{Field: "m", Value: fmt.Sprintf("member %d of group %s of set %s", m.Index, names.QuoteShort(m.Group), names.QuoteShort(m.set.Name)),
			Want: fmt.Sprintf("one of the Members of set %q; this one belongs to another set", s.Name)})
	}
	for name, r := range m.Ports {
		if m.shared[name] {
			continue
		}
		if _, ok := s.held[r.Label]; !ok {
			continue // already handed over
		}
		if err := s.a.Transfer(ctx, r, pid); err != nil {
			return err
		}
		delete(s.held, r.Label)
	}
	return nil
}

// TransferAll hands every port the set still holds, shared ones included,
// to the running process pid: for a set whose members all run as one
// process (berth run --set does this before it execs the command), or a
// supervisor that outlives the caller. Like Transfer it refuses a port
// that something else in this process holds too; ports handed over before
// such an error stay with pid.
func (s *Set) TransferAll(ctx context.Context, pid int) error {
	for l, r := range s.held {
		if err := s.a.Transfer(ctx, r, pid); err != nil {
			return err
		}
		delete(s.held, l)
	}
	return nil
}

// Manifest is the JSON form of an allocated set, for discovery tools.
type Manifest struct {
	Set     string           `json:"set"`
	Members []MemberManifest `json:"members"`
}

// MemberManifest is one member in a Manifest.
type MemberManifest struct {
	Group string                  `json:"group"`
	Index int                     `json:"index"`
	Ports map[string]PortManifest `json:"ports"`
	Env   []string                `json:"env"`
}

// PortManifest is one port in a Manifest.
type PortManifest struct {
	Protocol store.Protocol `json:"protocol"`
	Addr     netip.Addr     `json:"addr"`
	Port     uint16         `json:"port"`
	Shared   bool           `json:"shared"`
	Label    string         `json:"label"`
}

// Manifest returns the whole assignment.
func (s *Set) Manifest() Manifest {
	m := Manifest{Set: s.Name}
	for _, mem := range s.members {
		mm := MemberManifest{Group: mem.Group, Index: mem.Index, Ports: map[string]PortManifest{}, Env: mem.Env()}
		for name, r := range mem.Ports {
			mm.Ports[name] = PortManifest{r.Protocol, r.Addr, r.Port, mem.shared[name], r.Label}
		}
		m.Members = append(m.Members, mm)
	}
	return m
}

// WriteManifest writes the manifest as indented JSON to path, mode 0600.
func (s *Set) WriteManifest(path string) error {
	b, err := json.MarshalIndent(s.Manifest(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}
