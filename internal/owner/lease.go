package owner

import (
	"context"
	"strings"
	"sync"
	"time"
)

// A lease's row names, as its process, pid 1 of this process's pid
// namespace, with its start, and the scope "<boot id>/k1/<pid namespace>/<time
// namespace>/lease" (the lease clock's boot id, on macOS too): berth releases
// that know no leases judge it as a process that runs as long as the boot
// (or, across pid namespaces, the namespace), and keep it.
const leaseTag = "/lease"

var leaseID = sync.OnceValue(func() Identity {
	sc := host.scope()
	sc.boot = leaseBoot()
	id := Identity{PID: 1, Scope: sc.boot + "/" + scopeTag + "/" + sc.pidNS + "/" + sc.timeNS + leaseTag}
	// Where pid 1 cannot be read, the start stays 0: only berth releases
	// that knew no leases look at it.
	if r, err := host.read(context.Background(), 1); err == nil {
		id.Start = r.start
	}
	return id
})

// LeaseIdentity returns the pid, start and scope recorded for a lease taken
// by this process, with name as its Name.
// Leases of one boot and one pair of pid and time namespaces share it.
func LeaseIdentity(name string) Identity {
	id := leaseID()
	id.Name = name
	return id
}

// LeaseNow returns the lease clock of this process's boot and time
// namespace: nanoseconds since boot, suspend included, which no wall-clock
// step moves (CLOCK_BOOTTIME on Linux; CLOCK_MONOTONIC on macOS, which
// counts sleep). Where no such clock exists (Windows and other systems) it
// is the wall clock, in unix nanoseconds, and a step of the wall clock
// moves the end of every lease by as much.
func LeaseNow() (int64, error) { return leaseClock() }

// LeaseRemaining tells how long the lease of scope (see IsLeaseScope) that
// ends at until on the lease clock has left: 0 or less when it has ended,
// as a lease of another boot has. known is false when it cannot be told
// here (another time namespace, whose clock is offset by an amount this
// process cannot know, or a clock that cannot be read): it counts as live.
func LeaseRemaining(scope string, until int64) (left time.Duration, known bool) {
	sc, _ := parseScope(strings.TrimSuffix(scope, leaseTag))
	mine := host.scope()
	if differ(sc.boot, leaseBoot()) {
		return 0, true
	}
	// The time namespace of a lease scope is followed by nothing more.
	if differ(sc.timeNS, mine.timeNS) {
		return 0, false
	}
	now, err := leaseClock()
	if err != nil {
		return 0, false
	}
	return time.Duration(until - now), true
}
