// Package owner identifies processes across pid reuse and tells whether the
// process behind an identity still runs.
//
// # Identity
//
// A pid alone names a process only while it lives: the kernel hands the pid
// to a new process later. An Identity therefore also holds the process start
// as the kernel recorded it, and a scope that says where the pid and the
// start mean something. The start is a value no clock step can move:
//
//   - Linux: field 22 of /proc/PID/stat (starttime), clock ticks since boot.
//     The scope holds the boot id, because ticks restart at every boot, the
//     pid namespace, because containers that share a state directory reuse
//     each other's pids, and the time namespace, because the kernel offsets
//     starttime by the reader's time namespace.
//   - macOS and Windows: the kernel's p_starttime (kern.proc.pid sysctl) or
//     creation time (GetProcessTimes), unix milliseconds, written once
//     when the process starts.
//   - Other systems: gopsutil's CreateTime, unix milliseconds.
//
// Starts are compared exactly, and nothing Active reads is derived from
// the wall clock, the boot time or /proc/uptime: no clock step can make a
// live process look dead. On macOS and Windows the start is kept to the
// millisecond, the unit earlier releases recorded there.
//
// Scope is "<boot id>/k1/<pid namespace>/<time namespace>" on Linux (parts
// that cannot be read are empty) and "k1" elsewhere; earlier releases wrote
// "<boot id>/<pid namespace>" and a wall-clock start (see IsLegacy). The
// boot id stays in front so that an earlier release takes a current
// identity for one of another pid namespace, which it keeps, and never for
// one of another boot, which it would delete.
//
// # Liveness
//
// Active errs on the safe side: a reservation whose owner is taken for dead
// is handed out again. An owner in another pid namespace (a container
// sharing the state directory) is reaped from outside only when its
// namespace has no process left, which only root in the initial pid
// namespace can see; otherwise its rows stay until released, or reaped
// from inside (docker exec C berth reap, or nsenter -t PID -p berth reap).
//
// The functions of this package are safe for concurrent use.
package owner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// ErrNotRunning is returned by Lookup for a pid that has no live process,
// and by Upgrade for an identity whose process has exited.
var ErrNotRunning = errors.New("no such process")

// LegacyMargin is how far the start of a legacy identity (see IsLegacy) may
// be from the start its pid's process shows now and still count as that
// process. Legacy starts came from the wall clock, which every step since
// moved (in containers they were also rounded per process). A wide margin
// errs toward alive: a pid reused within it only delays reaping, whereas a
// narrow one would take live owners for dead after a clock correction.
const LegacyMargin = 10 * time.Minute

// Identity names one process for as long as it lives. The zero Identity
// names no process; IsZero reports it. An Identity is a value: copy and
// compare it freely.
type Identity struct {
	PID int // process id, as this process's pid namespace numbers it
	// Start is the process start as the kernel records it: on Linux clock
	// ticks since boot, on macOS and Windows unix milliseconds (see the
	// package doc). Compared exactly; for display use StartedAt. In a
	// legacy identity it is unix milliseconds derived from the wall clock.
	Start int64
	Scope string // where PID and Start mean something (see the package doc)
	Name  string // process name, for people; not part of the identity
}

// IsZero reports whether id names no process.
func (id Identity) IsZero() bool { return id.PID == 0 && id.Start == 0 && id.Scope == "" }

// Same reports whether id and other name the same process: equal pid, scope
// and start. Names are not compared.
func (id Identity) Same(other Identity) bool {
	return id.PID == other.PID && id.Scope == other.Scope && id.Start == other.Start
}

func (id Identity) String() string {
	if id.Name != "" {
		return fmt.Sprintf("pid %d (%s)", id.PID, id.Name)
	}
	return fmt.Sprintf("pid %d", id.PID)
}

// IsLegacy reports whether id was recorded by an earlier berth release: its
// scope is not in the current format and its start is wall-clock derived.
func IsLegacy(id Identity) bool {
	_, current := parseScope(id.Scope)
	return !current
}

var self atomic.Pointer[Identity]

// readSelf is bound by no caller's context: it reads on no one's behalf.
var readSelf = func() (Identity, error) { return lookupIn(context.Background(), host, os.Getpid()) }

// Self returns the identity of the calling process. A read that fails (out
// of descriptors, say) is not kept: the next call reads again.
func Self() (Identity, error) {
	if id := self.Load(); id != nil {
		return *id, nil
	}
	id, err := readSelf()
	if err != nil {
		return Identity{}, err
	}
	self.Store(&id)
	return id, nil
}

// BootID returns the id of the running boot of this machine, as the
// kernel gives it (/proc/sys/kernel/random/boot_id on Linux): it changes
// at every boot and differs between machines. It is "" where the system
// has none or it cannot be read.
func BootID() string { return host.scope().boot }

// Lookup returns the identity of the live process pid. It returns an error
// wrapping ErrNotRunning when there is none, or when it has exited and waits
// for its parent (a zombie).
//
// The scope recorded is this process's, also for another pid: pid and start
// are numbers of the reader's pid and time namespaces. With a child's own
// namespace recorded, its namespace-mates would judge an unrelated process
// of their number; with this process's, it stays checkable here, and they
// count it as live.
func Lookup(ctx context.Context, pid int) (Identity, error) {
	if !validPID(pid) {
		return Identity{}, fmt.Errorf("owner: pid %d: %w; want a positive process id", pid, ErrNotRunning)
	}
	if err := ctx.Err(); err != nil {
		return Identity{}, err
	}
	return lookupIn(ctx, host, pid)
}

func lookupIn(ctx context.Context, k kernel, pid int) (Identity, error) {
	r, err := k.read(ctx, pid)
	switch {
	case errors.Is(err, errGone):
		return Identity{}, fmt.Errorf("owner: pid %d: %w", pid, ErrNotRunning)
	case err != nil:
		return Identity{}, fmt.Errorf("owner: start of pid %d: %w", pid, err)
	case r.exited:
		return Identity{}, fmt.Errorf("owner: pid %d has exited: %w", pid, ErrNotRunning)
	}
	return Identity{PID: pid, Start: r.start, Scope: k.scope().String(), Name: NameOf(ctx, pid)}, nil
}

// Active reports whether the process that id names still runs. It is false
// when no process has the pid, when the process with that pid started at
// another time (the pid was reused), when it has exited and waits to be
// reaped by its parent, or when id comes from another boot. It is true in
// every case it cannot decide. Legacy identities (see IsLegacy) are judged
// with LegacyMargin.
func Active(ctx context.Context, id Identity) bool {
	v, _, _ := judge(ctx, host, id)
	return v != Dead
}

// Verdict is what judge decides about an identity.
type Verdict int

// The verdicts; Active counts Unknown as live.
const (
	Dead Verdict = iota
	Live
	Unknown
)

// Upgrade returns the current identity of the process a legacy identity
// names (see IsLegacy); a current identity unchanged. It returns an error
// wrapping ErrNotRunning when that process is dead as Active judges it, and
// another error when that cannot be decided (keep the identity as it is).
func Upgrade(ctx context.Context, id Identity) (Identity, error) { return upgradeIn(ctx, host, id) }

func upgradeIn(ctx context.Context, k kernel, id Identity) (Identity, error) {
	if !IsLegacy(id) {
		return id, nil
	}
	v, r, _ := judge(ctx, k, id)
	switch v {
	case Dead:
		return Identity{}, fmt.Errorf("owner: %s: %w", id, ErrNotRunning)
	case Unknown:
		return Identity{}, fmt.Errorf("owner: %s: cannot tell whether it still runs; keep it as it is", id)
	}
	up := Identity{PID: id.PID, Start: r.start, Scope: k.scope().String(), Name: id.Name}
	if up.Name == "" {
		up.Name = NameOf(ctx, id.PID)
	}
	return up, nil
}

// StartedAt returns the wall-clock time at which id's process started, as
// the wall clock reads now: it moves with every clock step. It is for
// display only and must never be compared to tell processes apart. It
// reports false where it cannot tell (another boot, another time
// namespace, the zero Identity).
func StartedAt(id Identity) (time.Time, bool) {
	if id.IsZero() {
		return time.Time{}, false
	}
	sc, current := parseScope(id.Scope)
	if !current {
		return time.UnixMilli(id.Start), true // legacy starts are unix ms
	}
	mine := host.scope()
	if differ(sc.boot, mine.boot) || differ(sc.timeNS, mine.timeNS) {
		return time.Time{}, false
	}
	ms, ok := host.wallMillis(id.Start)
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// judge decides whether id's process still runs, with the reading that
// showed it Live, or for Unknown the error that kept it from being read
// (nil when it cannot be judged from here at all: another namespace).
func judge(ctx context.Context, k kernel, id Identity) (Verdict, reading, error) {
	if !validPID(id.PID) {
		return Dead, reading{}, nil // from a damaged or hand-edited store
	}
	sc, current := parseScope(id.Scope)
	mine := k.scope()
	if differ(sc.boot, mine.boot) {
		return Dead, reading{}, nil // another boot: every process of it has ended
	}
	if differ(sc.pidNS, mine.pidNS) {
		// Another pid namespace: its pids mean nothing here.
		if k.pidNSGone(sc.pidNS) {
			return Dead, reading{}, nil
		}
		return Unknown, reading{}, nil
	}
	r, err := k.read(ctx, id.PID)
	switch {
	case errors.Is(err, errGone):
		return Dead, reading{}, nil
	case err != nil:
		return Unknown, reading{}, err
	case r.exited:
		// A zombie holds no sockets, so its reservations are free to reap.
		return Dead, reading{}, nil
	}
	if !current {
		ms, ok := k.wallMillis(r.start)
		if !ok {
			return Unknown, reading{}, nil
		}
		if d := ms - id.Start; d < -LegacyMargin.Milliseconds() || d > LegacyMargin.Milliseconds() {
			return Dead, reading{}, nil
		}
		return Live, r, nil
	}
	if differ(sc.timeNS, mine.timeNS) {
		// Starts read in another time namespace are offset by its boot
		// time offset, which this process cannot know.
		return Unknown, reading{}, nil
	}
	if r.start != id.Start {
		return Dead, reading{}, nil // the pid was reused
	}
	return Live, r, nil
}

func validPID(pid int) bool { return pid > 0 && pid <= math.MaxInt32 }

var errGone = errors.New("no such process")

type reading struct {
	start  int64 // the kernel's start value: Identity.Start
	exited bool  // it has exited and waits for its parent (a zombie)
}

// kernel is where readings come from: host, or a test's.
type kernel interface {
	// read returns errGone when no process has pid.
	read(ctx context.Context, pid int) (reading, error)
	scope() scope
	// wallMillis converts a start into unix milliseconds by the wall clock
	// as it reads now (legacy starts, StartedAt); never to tell current
	// identities apart.
	wallMillis(start int64) (int64, bool)
	// pidNSGone reports whether pid namespace ns certainly has no process left.
	pidNSGone(ns string) bool
}

// scope says where a pid and a start mean something; empty parts are unknown.
type scope struct {
	boot, pidNS, timeNS string // boot id, inode numbers of the namespaces
}

const scopeTag = "k1"

func (s scope) String() string {
	if s == (scope{}) {
		return scopeTag
	}
	return s.boot + "/" + scopeTag + "/" + s.pidNS + "/" + s.timeNS
}

// parseScope reports current false for the format of earlier releases.
func parseScope(s string) (sc scope, current bool) {
	if s == scopeTag {
		return scope{}, true
	}
	boot, rest, _ := strings.Cut(s, "/")
	if tail, ok := strings.CutPrefix(rest, scopeTag+"/"); ok {
		pidNS, timeNS, _ := strings.Cut(tail, "/")
		return scope{boot: boot, pidNS: pidNS, timeNS: timeNS}, true
	}
	return scope{boot: boot, pidNS: rest}, false
}

// differ reports whether two scope parts are known and different. An
// unknown part matches anything, as it did in earlier releases.
func differ(a, b string) bool { return a != "" && b != "" && a != b }
