package portset

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/names"
	"github.com/berth-go/berth/portalloc/internal/seam"
	"github.com/berth-go/berth/portalloc/scope"
)

// core is what a set reaches of its Allocator beyond its exported methods:
// holds under the set's name, and the rows this process has.
var core = seam.Get[*portalloc.Allocator, portalloc.Reservation, portalloc.Request, portalloc.Config]()

// Set is an allocated SetSpec. It is safe for concurrent use only for
// reading; Release and Transfer must not run concurrently.
type Set struct {
	Name    string
	members []*Member
	byName  map[memberKey]*Member
	a       *portalloc.Allocator
	via     string // the set's name for its holds (see refs)
	// held are the reservations the set still holds, by label.
	held map[string]portalloc.Reservation
}

type memberKey struct {
	group string
	index int
}

// Member is one member of a group with its ports.
type Member struct {
	Group string
	Index int
	// Ports are the member's ports by name: its own member-scoped ones and
	// its group's shared ones.
	Ports map[string]portalloc.Reservation
	// Scopes gives each port's scope, by name.
	Scopes map[string]Scope
	env    []string
	set    *Set // the set the member belongs to
}

// Env returns the member's environment variables as KEY=VALUE strings, ready
// to append to exec.Cmd.Env: one per port of its group and one per ref.
func (m *Member) Env() []string { return append([]string(nil), m.env...) }

// Members returns every member, in spec order.
func (s *Set) Members() []*Member { return s.members }

// Member returns member index of group. A group the set does not have, or
// an index outside 0 to the group's members less one, is a
// *portalloc.FieldError for "group" or "index" that says what the set
// has; the member is then nil.
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
		return nil, opError(op, &portalloc.FieldError{Field: "group", Value: group, Want: fmt.Sprintf("a group of set %q", s.Name)})
	}
	return nil, opError(op, &portalloc.FieldError{Field: "index", Value: strconv.Itoa(index), Want: fmt.Sprintf("0 to %d, a member of group %q", n-1, group)})
}

func label(set, group string, member int, port string) string {
	if member < 0 {
		return set + "/" + group + "/" + port
	}
	return set + "/" + group + "/" + strconv.Itoa(member) + "/" + port
}

// Allocate reserves every port of spec with a, or none: when one cannot be had,
// the holds taken so far are dropped, and rows this call created are
// released. Rows that existed before the call (a fixed port this process
// had already reserved, or the ports of an earlier allocation of the same
// spec) are never released by a failed Allocate. Allocating a spec again
// from the same process returns the ports the process already holds for it,
// each with a hold of the new Set: a row stays reserved until every Set,
// Allocator and pool of the process that holds it has released it.
func Allocate(ctx context.Context, a *portalloc.Allocator, spec SetSpec) (*Set, error) {
	s, err := allocate(ctx, a, spec)
	return s, opError(fmt.Sprintf("allocate set %s", names.QuoteShort(spec.Name)), err)
}

// allocate is Allocate without the prefix.
func allocate(ctx context.Context, a *portalloc.Allocator, spec SetSpec) (*Set, error) {
	if core.Closed(a) {
		return nil, portalloc.ErrClosed
	}
	ix, err := spec.index(setLimits)
	if err != nil {
		return nil, err
	}
	if n := core.Candidates(a).Len(); ix.need > n {
		return nil, refuse("groups", fmt.Sprintf("%d ports", ix.need), fmt.Sprintf("a set that needs at most the %d ports %s has to hand out; it needs %d ports allocated from the range", n, a.Config().Range, ix.need))
	}
	existing, existedBefore, err := core.OwnRows(ctx, a, spec.Name+"/")
	if err != nil {
		return nil, err
	}
	via := fmt.Sprintf("set %q", spec.Name)
	s := &Set{Name: spec.Name, a: a, via: via, held: map[string]portalloc.Reservation{}, byName: map[memberKey]*Member{}}
	// taken are the holds of this call, dropped if a later port fails;
	// existed says the row was there before the call and must stay.
	type hold struct {
		r       portalloc.Reservation
		existed bool
	}
	var taken []hold
	obtain := func(g GroupSpec, p PortSpec, member int) (portalloc.Reservation, error) {
		req := portalloc.Request{Protocol: p.Protocol, Addr: p.Addr, Label: label(spec.Name, g.Name, member, p.Name), Sticky: p.Sticky, Prefer: p.Prefer, Order: p.Order}
		if req.Protocol == "" {
			req.Protocol = portalloc.TCP
		}
		if !req.Addr.IsValid() {
			req.Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
		if r, ok := existing[scope.Label(a.Config().Scope, req.Label)]; ok && r.Protocol == req.Protocol && r.Addr == req.Addr.Unmap() && (p.Port == 0 || r.Port == p.Port) {
			r, err := core.Adopt(ctx, a, r, via)
			if err == nil {
				taken = append(taken, hold{r, true})
			}
			return r, err
		}
		r, err := core.Obtain(ctx, a, req, p.Port, via)
		if err == nil {
			// A scan only ever creates rows; Reserve may return one this
			// process had, which stays (when unsure, it is kept).
			existed := p.Port != 0 && existedBefore(r)
			taken = append(taken, hold{r, existed})
		}
		return r, err
	}
	fail := func(err error) (*Set, error) {
		rctx, cancel := core.ReleaseContext(ctx, a)
		defer cancel()
		for _, h := range taken {
			_ = core.Release(rctx, a, h.r, via, h.existed) // for logging only: reaping covers a failure
		}
		return nil, err
	}
	byRef := map[portRef]portalloc.Reservation{}
	for _, g := range spec.Groups {
		var group []*Member
		for i := range members(g) {
			m := &Member{Group: g.Name, Index: i, Ports: map[string]portalloc.Reservation{}, Scopes: map[string]Scope{}, set: s}
			group = append(group, m)
			s.byName[memberKey{g.Name, i}] = m
		}
		for _, p := range g.Ports {
			if scopeOf(p) == ScopeGroup {
				r, err := obtain(g, p, -1)
				if err != nil {
					return fail(err)
				}
				s.held[r.Label] = r
				byRef[portRef{g.Name, p.Name, -1}] = r
				for _, m := range group {
					m.Ports[p.Name], m.Scopes[p.Name] = r, ScopeGroup
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
				m.Ports[p.Name], m.Scopes[p.Name] = r, ScopeMember
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

// Release releases every port the set still holds, on whichever backend
// served it: it drops the set's hold, and a row no other holder of the
// process holds is deleted. It also releases the ports the set handed
// (Transfer, TransferAll) to processes that have exited by now; a child
// that still runs keeps its ports, and a later Release or the Allocator's
// Close looks again. It is a no-op (nil) when there is nothing left,
// and a row that is already gone is not an error; other errors are for
// logging, since reaping covers what a failed release leaves behind.
//
// Like portalloc.Allocator.Release it goes on when ctx is cancelled: the releases
// share a deadline of their own, portalloc.Config.Timeout, so that a deferred
// Release under a context the shutdown signal cancelled still releases.
func (s *Set) Release(ctx context.Context) error {
	ctx, cancel := core.ReleaseContext(ctx, s.a)
	defer cancel()
	return opError(fmt.Sprintf("release set %q", s.Name), s.release(ctx))
}

// release is Release within ctx, without the prefix.
func (s *Set) release(ctx context.Context) error {
	var errs []error
	for l, r := range s.held {
		if err := core.Release(ctx, s.a, r, s.via, false); err != nil && !errors.Is(err, portalloc.ErrNotHeld) && !errors.Is(err, portalloc.ErrClosed) {
			errs = append(errs, err)
		}
		delete(s.held, l)
	}
	if !core.Closed(s.a) {
		// Ports the set handed to children that have exited.
		if err := core.ReapHanded(ctx, s.a, s.via); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Transfer hands m's member-scoped ports to the running process pid, the
// child the caller started for m, so they stay reserved exactly as long as
// it runs, even if the caller dies first. Group-scoped ports are shared by
// all members and stay with the caller. Like portalloc.Allocator.Transfer it refuses
// a port that something else in this process holds too.
//
// m must be a member of s, as Members or Member return it: a nil member or
// one of another set is refused with a *portalloc.FieldError for "m", and
// nothing is transferred.
func (s *Set) Transfer(ctx context.Context, m *Member, pid int) error {
	op := fmt.Sprintf("transfer a member of set %q to pid %d", s.Name, pid)
	switch {
	case m == nil:
		return opError(op, &portalloc.FieldError{Field: "m", Value: "nil", Want: "one of the set's Members"})
	case m.set != s:
		return opError(op, &portalloc.FieldError{Field: "m", Value: fmt.Sprintf("member %d of group %s of set %s", m.Index, names.QuoteShort(m.Group), names.QuoteShort(m.set.Name)),
			Want: fmt.Sprintf("one of the Members of set %q; this one belongs to another set", s.Name)})
	}
	op = fmt.Sprintf("transfer member %d of group %q of set %q to pid %d", m.Index, m.Group, s.Name, pid)
	for name, r := range m.Ports {
		if m.Scopes[name] != ScopeMember {
			continue
		}
		if _, ok := s.held[r.Label]; !ok {
			continue // already handed over
		}
		if err := core.Transfer(ctx, s.a, r, pid, s.via); err != nil {
			return opError(op, err)
		}
		delete(s.held, r.Label)
	}
	return nil
}

// TransferAll hands every port the set still holds, group-scoped ones
// included, to the running process pid: for a set whose members all run as
// one process (berth run --set does this before it execs the command), or
// a supervisor that outlives the caller. Like Transfer it refuses a port
// that something else in this process holds too; ports handed over before
// such an error stay with pid.
func (s *Set) TransferAll(ctx context.Context, pid int) error {
	for l, r := range s.held {
		if err := core.Transfer(ctx, s.a, r, pid, s.via); err != nil {
			return opError(fmt.Sprintf("transfer set %q to pid %d", s.Name, pid), err)
		}
		delete(s.held, l)
	}
	return nil
}
