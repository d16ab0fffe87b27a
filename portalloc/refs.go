package portalloc

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Every Allocator of a process reserves as the same owner, so the state
// store has one row for a key however many Allocators, sets and pools of the
// process hold it: a Reserve of a key the process holds returns the existing
// row. The table below counts, process-wide, who holds each row, so that a
// row is deleted only when its last holder lets go of it. Without it, one
// Allocator's Close would free a port that another Allocator of the process
// still hands out, and another process would be given it too.

// refKey names one row of one state store file.
type refKey struct {
	store    string // the database file's path, symlinks of its directory resolved
	protocol Protocol
	addr     netip.Addr
	port     uint16
}

// refs is the process-wide table.
var refs = refTable{m: map[refKey]*refEntry{}}

type refTable struct {
	mu sync.Mutex // guards m, and users and holders of every entry
	m  map[refKey]*refEntry
}

// refEntry is one row's holders.
type refEntry struct {
	// turn is a one-slot semaphore held across a store call that may find,
	// create or delete the row: a Reserve that returns the existing row and
	// the release that decided to delete it never interleave.
	turn chan struct{}
	// holders lists, by Allocator, one entry per reference: "" for the
	// Allocator's own Reserve, or the set or pool that holds it.
	holders map[*Allocator][]string
	users   int // goroutines holding or waiting for turn
}

// lock takes k's turn, waiting at most until ctx is done.
func (t *refTable) lock(ctx context.Context, k refKey) (*refEntry, error) {
	t.mu.Lock()
	e := t.m[k]
	if e == nil {
		e = &refEntry{turn: make(chan struct{}, 1), holders: map[*Allocator][]string{}}
		t.m[k] = e
	}
	e.users++
	t.mu.Unlock()
	select {
	case e.turn <- struct{}{}:
		return e, nil
	case <-ctx.Done():
		t.leave(k, e)
		return nil, ctx.Err()
	}
}

// unlock gives k's turn back.
func (t *refTable) unlock(k refKey, e *refEntry) {
	<-e.turn
	t.leave(k, e)
}

func (t *refTable) leave(k refKey, e *refEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.users--; e.users == 0 && len(e.holders) == 0 {
		delete(t.m, k)
	}
}

// add records a reference of a, by via. The caller holds the turn.
func (t *refTable) add(e *refEntry, a *Allocator, via string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.holders[a] = append(e.holders[a], via)
}

// addNew records a reference of a to a row a scan has just created, which
// nobody else can hold yet: no turn is needed.
func (t *refTable) addNew(k refKey, a *Allocator, via string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil {
		e = &refEntry{turn: make(chan struct{}, 1), holders: map[*Allocator][]string{}}
		t.m[k] = e
	}
	e.holders[a] = append(e.holders[a], via)
}

// drop removes one reference of a: the one by via if there is one, else
// a's latest. It returns how many references a held before and how many
// remain in the process. The caller holds the turn.
func (t *refTable) drop(e *refEntry, a *Allocator, via string) (had, left int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	vias := e.holders[a]
	if had = len(vias); had > 0 {
		i := slices.Index(vias, via)
		if i < 0 {
			i = len(vias) - 1
		}
		if vias = slices.Delete(vias, i, i+1); len(vias) == 0 {
			delete(e.holders, a)
		} else {
			e.holders[a] = vias
		}
	}
	return had, e.countLocked()
}

// dropAll removes every reference of a and returns how many remain in the
// process. The caller holds the turn.
func (t *refTable) dropAll(e *refEntry, a *Allocator) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(e.holders, a)
	return e.countLocked()
}

// forget removes every reference of a without the turn, for a holder that
// cannot wait for it, and returns how many remain in the process.
func (t *refTable) forget(k refKey, a *Allocator) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil {
		return 0
	}
	delete(e.holders, a)
	if e.users == 0 && len(e.holders) == 0 {
		delete(t.m, k)
	}
	return e.countLocked()
}

// count returns a's references and everyone's. The caller holds the turn.
func (t *refTable) count(e *refEntry, a *Allocator) (mine, all int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(e.holders[a]), e.countLocked()
}

func (e *refEntry) countLocked() int {
	n := 0
	for _, vias := range e.holders {
		n += len(vias)
	}
	return n
}

// describe names the holders of e other than one reference of a by via,
// for error messages: `set "dev" of this Allocator`, `another Allocator of
// this process`. The caller holds the turn.
func (t *refTable) describe(e *refEntry, a *Allocator, via string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for h, vias := range e.holders {
		who := "another Allocator of this process"
		if h == a {
			who = "this Allocator"
			// Leave out the reference the caller speaks for.
			if i := slices.Index(vias, via); i >= 0 {
				vias = slices.Delete(slices.Clone(vias), i, i+1)
			} else if len(vias) > 0 {
				vias = vias[:len(vias)-1]
			}
		}
		for _, v := range vias {
			switch {
			case v != "":
				out = append(out, v+" of "+who)
			case h == a:
				out = append(out, "a Reserve of this Allocator")
			default:
				out = append(out, who)
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// canonicalDB returns the path that names the database file in refKeys:
// absolute, with the directory's symlinks resolved when it exists, so two
// Allocators given different spellings of one state directory share counts.
func canonicalDB(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs))
	}
	return abs
}

// refKeyOf is the row of r in a's store.
func (a *Allocator) refKeyOf(r Reservation) refKey {
	return refKey{store: a.dbKey, protocol: r.Protocol, addr: r.Addr, port: r.Port}
}

// sharedError is the error of a Transfer of a row other holders of this
// process still use: a *FieldError for the Reservation.
func sharedError(r Reservation, others string) error {
	return &FieldError{Field: "Reservation", Value: r.String(),
		Want: fmt.Sprintf("a reservation nothing else in this process holds; %s holds it too: release it there first (a transfer would take it from them)", others)}
}
