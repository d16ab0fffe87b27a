package portset

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/names"
	"github.com/berth-go/berth/store"
)

// Set is an allocated SetSpec. It is safe for concurrent use only for
// reading; Release and Transfer must not run concurrently.
type Set struct {
	Name    string
	members []*Member
	byName  map[memberKey]*Member
	a       *portalloc.Allocator
	// held are the reservations the set still holds, by label.
	held map[string]store.Reservation
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
	set    *Set // the set the member belongs to
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
func Allocate(ctx context.Context, a *portalloc.Allocator, spec SetSpec) (*Set, error) {
	s, err := allocate(ctx, a, spec)
	return s, opError(fmt.Sprintf("allocate set %s", names.QuoteShort(spec.Name)), err)
}

// allocate is Allocate without the prefix.
func allocate(ctx context.Context, a *portalloc.Allocator, spec SetSpec) (*Set, error) {
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
	// What the Allocator holds for this spec already, by the label it
	// recorded (in its scope).
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
		var (
			r   store.Reservation
			err error
		)
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
			if p.Shared {
				r, err := obtain(g, p, -1)
				if err != nil {
					return fail(err)
				}
				s.held[r.Label] = r
				byRef[portRef{g.Name, p.Name, -1}] = r
				for _, m := range group {
					m.Ports[p.Name], m.shared[p.Name] = r, true
				}
				continue
			}
			for _, m := range group {
				r, err := obtain(g, p, m.Index)
				if err != nil {
					return fail(err)
				}
				s.held[r.Label] = r
				byRef[portRef{g.Name, p.Name, m.Index}] = r
				m.Ports[p.Name] = r
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

// Release releases every port the set still holds: it drops the set's
// hold, and a port no other holder of the process holds is released. It is
// a no-op (nil) when there is nothing left, and a port that is already
// released is not an error; other errors are for logging, since reaping
// covers what a failed release leaves behind. Ports the set handed to
// other processes (Transfer, TransferAll) are theirs, reaped once they
// exit.
//
// Like portalloc.Allocator.Release it goes on when ctx is cancelled: the
// releases have a deadline of their own, portalloc.Config.Timeout each, so
// that a deferred Release under a context the shutdown signal cancelled
// still releases.
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
