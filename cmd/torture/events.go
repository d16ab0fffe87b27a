package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Event is one line of a process's append-only log.
//
// T is read from a clock that every process of the host shares and that no
// one steps: CLOCK_MONOTONIC on Linux (see monotonic). Events of different
// processes are ordered by it, and the clock-step mode moves the wall clock
// under the workers' feet: wall-clock stamps would order a release after a
// grant that followed it.
type Event struct {
	T    int64  `json:"t"`    // monotonic clock, nanoseconds
	Kind string `json:"kind"` // see the kind constants
	// Proc names the process the event is about, uniquely within a run:
	// "w7" is the seventh worker, "w7.3" its third child. Pids are not
	// enough: a long run starts more processes than the kernel has pids.
	Proc string `json:"proc"`
	PID  int    `json:"pid"`
	// Host is the fleet host (Config.Host) of a worker or child of a run
	// across hosts, or of a fleet worker's bind; empty otherwise. A key is
	// held per host: the checker compares claims of one host.
	Host    string `json:"host,omitempty"`
	Proto   string `json:"proto,omitempty"`
	Addr    string `json:"addr,omitempty"`
	Port    uint16 `json:"port,omitempty"`
	Static  bool   `json:"static,omitempty"`  // a grant from Reserve rather than Allocate
	Handoff bool   `json:"handoff,omitempty"` // a grant meant for a child, not bound by the worker itself
	// Fleet marks a fleet worker's events: a fleet-wide grant (a lease
	// row of no host), which is held on every host at once, its release,
	// and its binds, one per host.
	Fleet bool   `json:"fleet,omitempty"`
	Child string `json:"child,omitempty"` // the Proc a grant was handed to
	Err   string `json:"err,omitempty"`
	// DurNS is how long the call took (grant, exhausted, call), the
	// workers' call timeout (start), or the step (clock-step).
	DurNS int64 `json:"dur_ns,omitempty"`
	// Reaped is how many rows a worker's store has reaped so far (grant,
	// exit), or the rows a retirement deleted (retire).
	Reaped int64 `json:"reaped,omitempty"`
	// Probes is how many of a worker's bind probes failed during the call
	// a probe-failed event follows.
	Probes int64  `json:"probes,omitempty"`
	Op     string `json:"op,omitempty"` // the call a call event is about: allocate, reserve, release, transfer...
	// Timeout, Transient, Lost, Unavailable and Grace mark a call that failed in a way
	// counted, not an error (see timedCall); leases are lost with a lost file (Lost).
	Timeout     bool `json:"timeout,omitempty"`
	Transient   bool `json:"transient,omitempty"` // store.ErrTransient
	Lost        bool `json:"lost,omitempty"`      // store.ErrLost
	Unavailable bool `json:"unavailable,omitempty"`
	Grace       bool `json:"grace,omitempty"` // store.ErrGrace

	// Holder names the holder of a lease (grant, renew, release,
	// lease-ended, lease-drop): "w3/lease-7", unique within a run.
	Holder string `json:"holder,omitempty"`
	// TTLNS is the lease's TTL (grant, renew), and Since the monotonic
	// time (T's clock) at which the call that granted or renewed it began.
	// The store reads the lease clock (CLOCK_BOOTTIME) later within the
	// call, so the lease lasts at least until Since plus TTLNS: the
	// checker ends the claim there. CLOCK_BOOTTIME and CLOCK_MONOTONIC
	// advance together while the host is not suspended, and no wall-clock
	// step moves either.
	TTLNS int64 `json:"ttl_ns,omitempty"`
	Since int64 `json:"since,omitempty"`
	// EMFILE marks a bind that failed for want of descriptors (under
	// -fd-pressure): not a conflict, and the worker binds again once the
	// spell is over.
	EMFILE bool `json:"emfile,omitempty"`
	// Limit is the soft RLIMIT_NOFILE a pressure spell set, and Open the
	// descriptors the worker had open when it set it.
	Limit uint64 `json:"limit,omitempty"`
	Open  int    `json:"open,omitempty"`
	// Restored, NotRestored and Rereleased are what a worker's Allocator
	// did when it compared its reservations with the fleet's store (a
	// repair event): rows it put back, rows it could not put back
	// (another process had taken the port), releases it did again.
	Restored    int64 `json:"restored,omitempty"`
	NotRestored int64 `json:"not_restored,omitempty"`
	Rereleased  int64 `json:"rereleased,omitempty"`
	Sync        bool  `json:"sync,omitempty"` // a failover of a synchronous standby (failover, promoted)
}

// Event kinds.
const (
	KindGrant     = "grant"      // a port was handed to the worker
	KindBind      = "bind"       // the worker bound a grant (Err set on failure)
	KindRelease   = "release"    // the worker closed its socket and releases
	KindTransfer  = "transfer"   // the worker handed a grant to Child
	KindChildBind = "child-bind" // a child bound its port (Err set on failure)
	KindChildExit = "child-exit" // a child closed its socket and exits
	KindChildGone = "child-gone" // the worker reaped Child: its descriptors, its lock's included, are closed
	KindExhausted = "exhausted"  // Allocate found the range full
	KindLeaseHeld = "lease-held" // Reserve was refused a port a fleet-wide lease holds
	KindError     = "error"      // an unexpected error
	KindKill      = "kill"       // the supervisor is about to SIGKILL Proc
	KindDead      = "dead"       // Proc, SIGKILLed, is gone: its sockets and locks with it
	KindExit      = "exit"       // a worker released everything and exits
	KindCall      = "call"       // a worker's portalloc call returned (Op, DurNS, Timeout)
	KindProbe     = "probe"      // bind probes of the worker's last call failed (Probes)

	// Lease events (-leases). A grant of a lease is a KindGrant with Holder,
	// TTLNS and Since set; its release a KindRelease with Holder. Expiry is
	// implicit: the checker ends the claim at Since plus TTLNS of its last
	// grant or renewal.
	KindRenew       = "renew"       // the worker renewed Holder's lease
	KindLeaseEnded  = "lease-ended" // Renew said Holder holds nothing: the lease had ended (Err)
	KindLeaseDrop   = "lease-drop"  // the worker closed Holder's socket and stopped renewing: the lease runs out
	KindPressure    = "pressure"    // the worker lowered its RLIMIT_NOFILE to Limit for DurNS (-fd-pressure)
	KindPressureEnd = "pressure-end"
	// KindShort: something of the harness's own (starting a child) failed
	// for want of descriptors under -fd-pressure (Op, Err).
	KindShort = "short"

	// Written by the supervisor.
	KindStart     = "start"      // the workers are starting; DurNS is their call timeout
	KindStop      = "stop"       // the run is over; the workers are told to stop
	KindClockStep = "clock-step" // CLOCK_REALTIME was stepped by DurNS
	KindFreeze    = "freeze"     // Proc is about to get SIGSTOP
	KindThaw      = "thaw"       // Proc got SIGCONT
	KindStuck     = "stuck"      // Proc did not exit in time once told to stop
	// KindRetire: Host was retired from another host (Retire), after
	// every process on it had been killed; every claim on it ends here.
	KindRetire = "retire"
	// KindLoseStore: the store's directory was removed or its file
	// replaced or truncated (Op says which).
	KindLoseStore = "lose-store"
	// KindPGRestart: the run's server was restarted, logged once it takes
	// connections again; DurNS is how long that took.
	KindPGRestart = "pg-restart"
	// KindFailover: the primary was SIGKILLed, every process of it gone
	// (Sync: its standby was synchronous). KindPromoted: the standby has
	// become the primary. KindRebuilt: a new standby streams from it
	// (DurNS: the whole failover).
	KindFailover = "failover"
	KindPromoted = "promoted"
	KindRebuilt  = "rebuilt"

	// KindRepair: a worker's Allocator compared its reservations with the
	// fleet's store after a restart or a failover (see Restored).
	KindRepair = "repair"
	// KindRerelease: a worker's Allocator released again, as a release
	// lost in a failover or one that failed, the row of Proto, Addr and
	// Port (Err: its log message). The worker must not hold the key then:
	// its row would be gone while it binds the port.
	KindRerelease = "rerelease"
	// KindProbeKey: a probe of the worker's store found Proto, Addr and
	// Port bound, or locked by another process, while the store held no
	// row for it (pgstore's "port held outside this store"); the
	// probe-failed event of the call counts it.
	KindProbeKey = "probe-key"
	// KindStoreLog: a worker's Allocator or store logged a decision at
	// info level (Err), such as a lost store set aside: where a violation
	// follows a loss, these say what each process did about it.
	KindStoreLog = "store-log"
)

// eventLog appends events to a file, one write per event, so a SIGKILL
// loses at most the event being written.
type eventLog struct {
	mu   sync.Mutex // guards f
	f    *os.File
	proc string
	pid  int
	host string // the process's fleet host, from envHost
}

func openLog(dir, proc string) (*eventLog, error) {
	f, err := os.OpenFile(filepath.Join(dir, "logs", proc+".jsonl"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("torture: event log: %w", err)
	}
	return &eventLog{f: f, proc: proc, pid: os.Getpid(), host: os.Getenv(envHost)}, nil
}

func (l *eventLog) add(e Event) {
	if e.T == 0 {
		e.T = monotonic()
	}
	if e.Proc == "" {
		e.Proc, e.PID = l.proc, l.pid
		if e.Host == "" { // a fleet worker's binds name their host
			e.Host = l.host
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(b, '\n'))
}
