// Package owner identifies processes across pid reuse and tells whether the
// process behind an identity still runs.
//
// # Identity
//
// A pid alone names a process only while it lives: the kernel hands the pid
// to a new process later. An Identity therefore also holds the process start
// time (wall clock, unix milliseconds, so it survives reboots) and, on Linux,
// a scope made of the boot id and the pid namespace, because containers that
// share a state directory reuse each other's pids.
//
// # Liveness
//
// Active decides whether an identity's process still runs. It errs on the safe
// side: a reservation whose owner is taken for dead is handed out again, so
// every doubt (a process that cannot be inspected, a pid namespace this
// process cannot see) counts as alive. Start times are compared with
// Tolerance because they are derived from the boot time and clock ticks, and
// two readings of the same process may differ by a tick.
package owner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/shirou/gopsutil/v4/process"
)

// Tolerance is the largest difference between two readings of one process's
// start time that still counts as the same process.
const Tolerance = 50 * time.Millisecond

// ErrNotRunning is returned by Lookup for a pid that has no live process.
var ErrNotRunning = errors.New("no such process")

// Identity names one process for as long as it lives. The zero Identity
// names no process; IsZero reports it.
type Identity struct {
	PID   int    // process id
	Start int64  // start time, unix milliseconds
	Scope string // boot id and pid namespace ("" where the OS has neither)
	Name  string // process name, for people; not part of the identity
}

// IsZero reports whether id names no process.
func (id Identity) IsZero() bool { return id.PID == 0 && id.Start == 0 }

// Same reports whether id and other name the same process: equal pid and
// scope, start times within Tolerance. Names are not compared.
func (id Identity) Same(other Identity) bool {
	return id.PID == other.PID && id.Scope == other.Scope && startsMatch(id.Start, other.Start)
}

func (id Identity) String() string {
	if id.Name != "" {
		return fmt.Sprintf("pid %d (%s)", id.PID, id.Name)
	}
	return fmt.Sprintf("pid %d", id.PID)
}

func startsMatch(a, b int64) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= Tolerance.Milliseconds()
}

func init() {
	// Every liveness check reads a start time, which gopsutil derives from
	// the boot time; reading that once keeps checks cheap and consistent.
	process.EnableBootTimeCache(true)
}

var self = sync.OnceValues(func() (Identity, error) {
	return lookup(context.Background(), os.Getpid())
})

// Self returns the identity of the calling process. It is read once.
func Self() (Identity, error) { return self() }

// Lookup returns the identity of the live process pid. It returns an error
// wrapping ErrNotRunning when there is none.
func Lookup(ctx context.Context, pid int) (Identity, error) {
	if pid <= 0 || pid > math.MaxInt32 {
		return Identity{}, fmt.Errorf("owner: pid %d: %w; want a positive process id", pid, ErrNotRunning)
	}
	return lookup(ctx, pid)
}

func lookup(ctx context.Context, pid int) (Identity, error) {
	p, err := process.NewProcessWithContext(ctx, int32(pid))
	if err != nil {
		if errors.Is(err, process.ErrorProcessNotRunning) {
			return Identity{}, fmt.Errorf("owner: pid %d: %w", pid, ErrNotRunning)
		}
		return Identity{}, fmt.Errorf("owner: pid %d: %w", pid, err)
	}
	start, err := p.CreateTimeWithContext(ctx)
	if err != nil {
		if gone(ctx, p) {
			return Identity{}, fmt.Errorf("owner: pid %d: %w", pid, ErrNotRunning)
		}
		return Identity{}, fmt.Errorf("owner: start time of pid %d: %w", pid, err)
	}
	if zombie(ctx, p) {
		return Identity{}, fmt.Errorf("owner: pid %d has exited: %w", pid, ErrNotRunning)
	}
	name, _ := p.NameWithContext(ctx) // a name is for people; its absence changes nothing
	return Identity{PID: pid, Start: start, Scope: scope(), Name: name}, nil
}

// Active reports whether the process that id names still runs. It is false
// when no process has the pid, when the process with that pid started at
// another time (the pid was reused), when it has exited and waits to be
// reaped by its parent, or when id comes from another boot. It is true in
// every case it cannot decide.
func Active(ctx context.Context, id Identity) bool {
	if id.PID <= 0 || id.PID > math.MaxInt32 {
		// No process can have this pid; such a row can only come from a
		// damaged or hand-edited store.
		return false
	}
	mine := scope()
	if id.Scope != mine && id.Scope != "" && mine != "" {
		theirBoot, theirNS := splitScope(id.Scope)
		myBoot, myNS := splitScope(mine)
		if theirBoot != myBoot {
			return false // another boot: every process of it has ended
		}
		if theirNS != myNS {
			return true // another pid namespace: its pids mean nothing here
		}
	}
	p, err := process.NewProcessWithContext(ctx, int32(id.PID))
	if err != nil {
		return !errors.Is(err, process.ErrorProcessNotRunning)
	}
	start, err := p.CreateTimeWithContext(ctx)
	if err != nil {
		return !gone(ctx, p)
	}
	if !startsMatch(start, id.Start) {
		return false
	}
	return !zombie(ctx, p)
}

// gone reports whether p has disappeared, as opposed to being unreadable.
func gone(ctx context.Context, p *process.Process) bool {
	ok, err := process.PidExistsWithContext(ctx, p.Pid)
	return err == nil && !ok
}

// zombie reports whether p has exited and waits for its parent to reap it.
// A zombie holds no sockets, so its reservations are free to reap.
func zombie(ctx context.Context, p *process.Process) bool {
	st, err := p.StatusWithContext(ctx)
	return err == nil && len(st) > 0 && st[0] == process.Zombie
}

func splitScope(s string) (boot, ns string) {
	boot, ns, _ = strings.Cut(s, "/")
	return boot, ns
}
