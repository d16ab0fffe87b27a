// Package portalloc hands out TCP and UDP ports that no other program on
// the host is given at the same time, and that come back by themselves
// when the program holding them exits.
//
// An Allocator reserves ports in a SQLite state store shared by every berth
// process of the user (package statestore), or, when that store cannot be
// used, in the legacy MRU file (package mru). Either way a port is
// bind-probed before it is handed out, inside the same store transaction that
// records it, so no other berth process can choose it in between.
//
// # Reservation lifecycle
//
// A reservation belongs to the process that made it (pid and start time). It
// ends with Release, with Close (which releases everything the Allocator
// still holds), or when its owner exits: the next reservation that needs the
// port, the background sweep, or statestore's Reap deletes it. Transfer gives
// a reservation to another process, such as a child the caller started, so
// the port stays reserved exactly as long as that process runs. Several
// Allocators in one process share its identity: each releases on Close what
// it reserved itself, but a Reserve of a key the process already holds,
// from any of them, returns that reservation.
//
// # Beyond single ports
//
// AllocateSet reserves the named ports of groups of processes and gives each
// member its environment; Listen binds a port inside the reserving
// transaction and Handoff passes the socket to a child; NewPool keeps ports
// reserved ahead of time for hot paths; Stats, Usage and Publish expose
// metrics. Package porttest gives tests their ports.
package portalloc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/internal/probe"
	"github.com/berth-go/berth/mru"
	"github.com/berth-go/berth/statestore"
)

// Backend names, as reported in Reservation.Backend.
const (
	BackendStateStore = "statestore"
	BackendMRU        = "mru"
)

// Request describes the port a caller wants.
type Request struct {
	Protocol Protocol   // zero: TCP
	Address  netip.Addr // zero: 127.0.0.1; 0.0.0.0 and :: are the wildcards
	Label    string     // the caller's name for the port, shown in listings
	// Sticky asks Allocate for the port last handed out under Label (kept
	// in the state store across restarts) when it is free and in the
	// range; otherwise any free port, with the reason logged. It needs a
	// Label. The MRU backend remembers nothing and ignores it.
	Sticky bool
}

// Reservation is a port handed out by an Allocator.
type Reservation struct {
	Protocol Protocol
	Address  netip.Addr
	Port     uint16
	Label    string
	Backend  string // BackendStateStore or BackendMRU
}

// AddrPort returns the reservation's address and port.
func (r Reservation) AddrPort() netip.AddrPort { return netip.AddrPortFrom(r.Address, r.Port) }

func (r Reservation) String() string {
	return fmt.Sprintf("%s %s", r.Protocol, r.AddrPort())
}

// Allocator hands out ports. It is safe for concurrent use. Its zero value
// is not usable: call New.
type Allocator struct {
	cfg   Config
	log   logr.Logger
	set   *portrange.Set
	store *statestore.Store // nil in ModeMRU or when it could not be opened
	mru   *mru.File

	fellBack     atomic.Bool // new allocations go to the MRU file
	fallbackOnce sync.Once
	fallbackErr  atomic.Pointer[error]

	rngMu sync.Mutex // guards rng
	rng   *rand.Rand

	ctr counters

	mu     sync.Mutex // guards held, pools and closed
	held   map[heldKey]Reservation
	pools  []*Pool
	closed bool
}

type heldKey struct {
	protocol Protocol
	addr     netip.Addr
	port     uint16
}

func keyOf(r Reservation) heldKey { return heldKey{r.Protocol, r.Address, r.Port} }

var ephemeralWarning sync.Once

// maxBusyWait bounds how long a call waits for a store that another
// program keeps locked.
const maxBusyWait = 5 * time.Second

// New validates cfg and returns an Allocator. In the state-store modes it
// opens (creating if needed) the store in cfg.StateDir. In
// ModeStateStoreWithFallback a store that cannot be opened makes the
// Allocator serve from the MRU file instead, logged once; in ModeStateStore
// it is an error wrapping ErrStoreUnavailable.
func New(ctx context.Context, cfg Config) (*Allocator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	set, err := candidateSet(cfg)
	if err != nil {
		return nil, err
	}
	a := &Allocator{
		cfg:  cfg,
		log:  cfg.Logger,
		set:  set,
		mru:  mru.New(filepath.Join(cfg.StateDir, MRUFile), mru.Options{Logger: cfg.Logger}),
		rng:  rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		held: map[heldKey]Reservation{},
	}
	if cfg.Mode == ModeMRU {
		a.fellBack.Store(true)
		return a, nil
	}
	// A store locked by something else for half the allocation timeout is
	// a failure: in the fallback mode the MRU file then has the other half.
	busy := min(cfg.Timeout/2, maxBusyWait)
	store, err := statestore.Open(ctx, filepath.Join(cfg.StateDir, DatabaseFile), statestore.Options{Logger: cfg.Logger, BusyTimeout: busy})
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if cfg.Mode == ModeStateStore {
			return nil, fmt.Errorf("portalloc: %w: %w", ErrStoreUnavailable, err)
		}
		a.fallBack(err)
		return a, nil
	}
	a.store = store
	return a, nil
}

// candidateSet is the range less exclusions, the OS ephemeral range (unless
// allowed) and the ports the OS reserves for itself.
func candidateSet(cfg Config) (*portrange.Set, error) {
	exclude := append([]Range(nil), cfg.Exclude...)
	if !cfg.AllowEphemeralOverlap {
		eph, err := portrange.Ephemeral()
		if err != nil {
			cfg.Logger.Info("could not read the OS ephemeral port range; assuming the IANA range", "range", eph.String(), "error", err.Error())
		}
		if cfg.Range.Overlaps(eph) {
			ephemeralWarning.Do(func() {
				cfg.Logger.Info("the port range overlaps the OS ephemeral range; leaving the overlap out (set AllowEphemeralOverlap to keep it)",
					"range", cfg.Range.String(), "ephemeral", eph.String())
			})
			exclude = append(exclude, eph)
		}
	}
	reserved, err := portrange.ReservedByOS()
	if err != nil {
		cfg.Logger.Info("could not read the ports the OS reserves", "error", err.Error())
	}
	exclude = append(exclude, reserved...)
	set := portrange.NewSet(cfg.Range, exclude...)
	if set.Len() == 0 {
		return nil, fmt.Errorf("%w: Config.Range %s has no port left after exclusions and the OS ephemeral range; widen it, or set AllowEphemeralOverlap", ErrInvalidRequest, cfg.Range)
	}
	return set, nil
}

// fallBack switches new allocations to the MRU file, logging the first
// cause.
func (a *Allocator) fallBack(cause error) {
	a.fallbackOnce.Do(func() {
		a.fallbackErr.Store(&cause)
		a.fellBack.Store(true)
		a.ctr.fallbacks.Add(1)
		a.log.Error(cause, "state store unavailable; allocating from the MRU file instead", "mru", a.mru.Path())
	})
}

// Backend returns the backend that serves new allocations now.
func (a *Allocator) Backend() string {
	if a.fellBack.Load() {
		return BackendMRU
	}
	return BackendStateStore
}

// FallbackCause returns why the Allocator fell back to the MRU file, or nil
// if it has not (or was configured with ModeMRU).
func (a *Allocator) FallbackCause() error {
	if p := a.fallbackErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Config returns the configuration in effect, with defaults filled in.
func (a *Allocator) Config() Config { return a.cfg }

func (a *Allocator) normalize(req Request) (Request, error) {
	switch req.Protocol {
	case "":
		req.Protocol = TCP
	case TCP, UDP:
	default:
		return Request{}, fmt.Errorf("%w: protocol %q: want \"tcp\" or \"udp\"", ErrInvalidRequest, req.Protocol)
	}
	if !req.Address.IsValid() {
		req.Address = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	addr, err := netaddr.Normalize(req.Address)
	if err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	req.Address = addr
	return req, nil
}

func (a *Allocator) begin(ctx context.Context, req Request) (context.Context, context.CancelFunc, Request, error) {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, nil, Request{}, ErrClosed
	}
	req, err := a.normalize(req)
	if err != nil {
		return nil, nil, Request{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, Request{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	return ctx, cancel, req, nil
}

func probeKey(k statestore.Key) (bool, error) {
	return probe.Available(string(k.Protocol), k.Addr, k.Port)
}

// Allocate reserves a free port of the configured range for req and returns
// it. The port has been bind-probed on req.Address. It returns an error
// wrapping ErrRangeExhausted when no port is free.
func (a *Allocator) Allocate(ctx context.Context, req Request) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	if req.Sticky && req.Label == "" {
		return Reservation{}, fmt.Errorf("%w: a sticky request needs a Label to remember its port under", ErrInvalidRequest)
	}
	return a.allocate(ctx, req, a.set, probeFunc(req))
}

func probeFunc(req Request) func(uint16) (bool, error) {
	return func(p uint16) (bool, error) {
		return probe.Available(string(req.Protocol), req.Address, p)
	}
}

// allocateIn is allocate with the probe, on a set of ports of the range
// (a pool's). The caller has run begin.
func (a *Allocator) allocateIn(ctx context.Context, req Request, set *portrange.Set) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	return a.allocate(ctx, req, set, probeFunc(req))
}

// allocate walks set for req and takes the first port that the backend has
// free and bindable passes. bindable runs inside the store's write
// transaction.
func (a *Allocator) allocate(ctx context.Context, req Request, set *portrange.Set, bindable func(uint16) (bool, error)) (Reservation, error) {
	if !a.fellBack.Load() {
		next, sticky := a.candidates(ctx, req, set)
		r, err := a.store.Scan(ctx, statestore.ScanRequest{
			Protocol: statestore.Protocol(req.Protocol),
			Addr:     req.Address,
			Label:    req.Label,
			Next:     next,
			Probe:    func(k statestore.Key) (bool, error) { return bindable(k.Port) },
		})
		if err == nil {
			a.remember(ctx, req, sticky, r.Port)
			return a.track(Reservation{Protocol: req.Protocol, Address: r.Addr, Port: r.Port, Label: req.Label, Backend: BackendStateStore})
		}
		if err := a.storeErr(ctx, err, req, 0); err != nil {
			return Reservation{}, err
		}
	}
	// The MRU backend, from the start or after a fallback: a fresh walk.
	next, _ := a.candidates(ctx, Request{}, set)
	port, err := a.mru.Allocate(ctx, mru.Request{
		Protocol: string(req.Protocol),
		Addr:     req.Address,
		Next:     next,
		Probe: func(p uint16) (bool, error) {
			free, err := bindable(p)
			if err == nil && !free {
				a.ctr.mruProbeFailures.Add(1)
			}
			return free, err
		},
	})
	if err != nil {
		return Reservation{}, a.mruErr(ctx, err, req)
	}
	return a.track(Reservation{Protocol: req.Protocol, Address: req.Address, Port: port, Label: req.Label, Backend: BackendMRU})
}

// candidates returns the walk over the range, led by the sticky port of a
// sticky request (0 when there is none).
func (a *Allocator) candidates(ctx context.Context, req Request, set *portrange.Set) (func() (uint16, bool), uint16) {
	a.rngMu.Lock()
	it := set.Candidates(a.rng)
	a.rngMu.Unlock()
	if !req.Sticky || a.store == nil {
		return it.Next, 0
	}
	p, ok, err := a.store.Recall(ctx, req.Label, statestore.Protocol(req.Protocol))
	switch {
	case err != nil:
		a.log.Error(err, "could not recall the sticky port; allocating afresh", "label", req.Label)
		return it.Next, 0
	case !ok:
		return it.Next, 0
	case !set.Contains(p):
		a.log.Info("sticky port is outside the range now; allocating afresh", "label", req.Label, "port", p, "range", a.cfg.Range.String())
		return it.Next, 0
	}
	first := true
	return func() (uint16, bool) {
		if first {
			first = false
			return p, true
		}
		return it.Next()
	}, p
}

// remember records a sticky request's port, and logs when it is not the
// one it had before.
func (a *Allocator) remember(ctx context.Context, req Request, sticky, got uint16) {
	if !req.Sticky {
		return
	}
	if sticky != 0 && sticky != got {
		a.log.Info("sticky port was not free (held or bound by another process); allocated another", "label", req.Label, "was", sticky, "now", got)
	}
	if err := a.store.Remember(ctx, req.Label, statestore.Protocol(req.Protocol), got); err != nil {
		a.log.Error(err, "could not remember the sticky port", "label", req.Label)
	}
}

// Reserve reserves the given port for req, whether or not it lies in the
// configured range. It returns a *ConflictError (errors.Is ErrPortHeld) when
// another process holds it, or when this process already holds a
// conflicting reservation (such as its own wildcard on the port). Reserving
// a port this process already holds on the same address returns it again.
func (a *Allocator) Reserve(ctx context.Context, req Request, port uint16) (r Reservation, err error) {
	defer func() { a.ctr.count(true, err) }()
	if port == 0 {
		return Reservation{}, fmt.Errorf("%w: port 0: want a port from 1 to 65535 (use Allocate for any free port)", ErrInvalidRequest)
	}
	ctx, cancel, req, err := a.begin(ctx, req)
	if err != nil {
		return Reservation{}, err
	}
	defer cancel()
	if !a.fellBack.Load() {
		r, err := a.store.Reserve(ctx, statestore.Request{
			Key:   statestore.Key{Protocol: statestore.Protocol(req.Protocol), Addr: req.Address, Port: port},
			Label: req.Label,
			Kind:  statestore.Static,
			Probe: probeKey,
		})
		if err == nil {
			return a.track(Reservation{Protocol: req.Protocol, Address: r.Addr, Port: r.Port, Label: r.Label, Backend: BackendStateStore})
		}
		if err := a.storeErr(ctx, err, req, port); err != nil {
			return Reservation{}, err
		}
	}
	free, err := probe.Available(string(req.Protocol), req.Address, port)
	if err != nil {
		return Reservation{}, a.probeErr(err, req)
	}
	if !free {
		a.ctr.mruProbeFailures.Add(1)
		return Reservation{}, &ConflictError{Protocol: req.Protocol, Address: req.Address, Port: port}
	}
	if err := a.mru.Record(ctx, string(req.Protocol), port); err != nil {
		a.log.Error(err, "could not record a reserved port in the MRU file", "port", port)
	}
	return a.track(Reservation{Protocol: req.Protocol, Address: req.Address, Port: port, Label: req.Label, Backend: BackendMRU})
}

// storeErr translates a state store error. It returns nil when the caller
// should go on with the MRU file (a storage failure in the fallback mode).
func (a *Allocator) storeErr(ctx context.Context, err error, req Request, port uint16) error {
	var ce *statestore.ConflictError
	switch {
	case errors.As(err, &ce):
		return fromStoreConflict(ce)
	case errors.Is(err, statestore.ErrExhausted):
		return fmt.Errorf("portalloc: %s on %s in %s: %w", req.Protocol, req.Address, a.cfg.Range, ErrRangeExhausted)
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, statestore.ErrInvalid):
		return fmt.Errorf("portalloc: %w: %w", ErrInvalidRequest, err)
	case errors.Is(err, statestore.ErrStorage) || errors.Is(err, statestore.ErrClosed):
		if a.cfg.Mode == ModeStateStore {
			return fmt.Errorf("portalloc: %w: %w", ErrStoreUnavailable, err)
		}
		a.fallBack(err)
		return nil
	default:
		// A probe error: says nothing about the store.
		return a.probeErr(err, req)
	}
}

func (a *Allocator) mruErr(ctx context.Context, err error, req Request) error {
	switch {
	case errors.Is(err, mru.ErrExhausted):
		return fmt.Errorf("portalloc: %s on %s in %s: %w", req.Protocol, req.Address, a.cfg.Range, ErrRangeExhausted)
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return a.probeErr(err, req)
	}
}

func (a *Allocator) probeErr(err error, req Request) error {
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		return fmt.Errorf("portalloc: %w: address %s is not an address of this host: %w", ErrInvalidRequest, req.Address, err)
	}
	return fmt.Errorf("portalloc: %w", err)
}

func (a *Allocator) track(r Reservation) (Reservation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held[keyOf(r)] = r
	a.log.V(1).Info("reserved port", "protocol", string(r.Protocol), "address", r.Address.String(), "port", r.Port, "label", r.Label, "backend", r.Backend)
	return r, nil
}

// Release gives r back. It never needs to fail the caller: the error it
// returns is for logging, and a reservation that could not be released is
// reaped once this process exits.
func (a *Allocator) Release(ctx context.Context, r Reservation) error {
	a.mu.Lock()
	delete(a.held, keyOf(r))
	closed := a.closed
	a.mu.Unlock()
	switch r.Backend {
	case BackendMRU:
		// The MRU file keeps the port as recently handed out until it expires.
		return nil
	case BackendStateStore:
		if closed {
			return ErrClosed
		}
		if a.store == nil {
			return fmt.Errorf("%w: reservation %s is from a state store this Allocator does not have", ErrInvalidRequest, r)
		}
		err := a.store.Release(ctx, statestore.Key{Protocol: statestore.Protocol(r.Protocol), Addr: r.Address, Port: r.Port}, statestore.Owner{})
		if err != nil {
			return fmt.Errorf("portalloc: release %s: %w", r, err)
		}
		return nil
	default:
		return fmt.Errorf("%w: reservation backend %q: want %q or %q", ErrInvalidRequest, r.Backend, BackendStateStore, BackendMRU)
	}
}

// Transfer hands r to the running process pid, typically a child the caller
// has just started: the port then stays reserved exactly as long as that
// process runs, even if the caller exits first, and Close no longer
// releases it. Reservations of the MRU backend have no owner; for them
// Transfer only stops this Allocator from tracking the port.
func (a *Allocator) Transfer(ctx context.Context, r Reservation, pid int) error {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return ErrClosed
	}
	switch r.Backend {
	case BackendMRU:
	case BackendStateStore:
		if a.store == nil {
			return fmt.Errorf("%w: reservation %s is from a state store this Allocator does not have", ErrInvalidRequest, r)
		}
		to, err := statestore.LookupOwner(ctx, pid)
		if err != nil {
			return fmt.Errorf("portalloc: transfer %s: %w: pid %d is not a running process: %w", r, ErrInvalidRequest, pid, err)
		}
		key := statestore.Key{Protocol: statestore.Protocol(r.Protocol), Addr: r.Address, Port: r.Port}
		if err := a.store.Transfer(ctx, key, statestore.Owner{}, to); err != nil {
			return fmt.Errorf("portalloc: transfer %s to pid %d: %w", r, pid, err)
		}
	default:
		return fmt.Errorf("%w: reservation backend %q: want %q or %q", ErrInvalidRequest, r.Backend, BackendStateStore, BackendMRU)
	}
	a.mu.Lock()
	delete(a.held, keyOf(r))
	a.mu.Unlock()
	return nil
}

// Reap deletes every reservation in the store whose owner has exited, for
// example those of children that were handed ports and have stopped, and
// returns how many it deleted. The store also reaps on its own, in the
// background and whenever a dead owner's row stands in the way; Reap just
// does it now. In the MRU backend there is nothing to reap.
func (a *Allocator) Reap(ctx context.Context) (int, error) {
	if a.store == nil {
		return 0, nil
	}
	n, err := a.store.Reap(ctx)
	if err != nil {
		return n, fmt.Errorf("portalloc: reap: %w", err)
	}
	return n, nil
}

// Held returns the reservations this Allocator holds: made by it and not yet
// released or transferred.
func (a *Allocator) Held() []Reservation {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Reservation, 0, len(a.held))
	for _, r := range a.held {
		out = append(out, r)
	}
	return out
}

// closeTimeout bounds the releases Close makes.
const closeTimeout = 10 * time.Second

// Close closes the Allocator's pools, releases every reservation it still
// holds and closes the state store. Later calls return ErrClosed; Close itself is idempotent. Its
// error is for logging: what it could not release is reaped once this
// process exits.
func (a *Allocator) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	pools := a.pools
	a.pools = nil
	a.mu.Unlock()
	// Pools first, while their idle members can still be released.
	var errs []error
	for _, p := range pools {
		if err := p.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	a.mu.Lock()
	a.closed = true
	held := a.held
	a.held = nil
	a.mu.Unlock()

	if a.store == nil {
		return errors.Join(errs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	for _, r := range held {
		if r.Backend != BackendStateStore {
			continue
		}
		key := statestore.Key{Protocol: statestore.Protocol(r.Protocol), Addr: r.Address, Port: r.Port}
		if err := a.store.Release(ctx, key, statestore.Owner{}); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", r, err))
		}
	}
	errs = append(errs, a.store.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("portalloc: close: %w", err)
	}
	return nil
}
