// Package portalloc hands out TCP and UDP ports that no other program on
// the host is given at the same time, and that come back by themselves
// when the program holding them exits.
//
// An Allocator reserves ports in a SQLite state store shared by every berth
// process of the user (package statestore), or, when that store cannot be
// used, in the legacy MRU file (package mru). Either way a port is
// bind-probed before it is handed out; in the store, inside the same
// transaction that records it, so no other berth process can choose it in
// between.
//
// # Reservation lifecycle
//
// A reservation belongs to the process that made it (pid and start time). It
// ends with Release, with Close (which releases everything the Allocator
// still holds), or when its owner exits: the next reservation that needs the
// port, the background sweep, or statestore's Reap deletes it. Transfer gives
// a reservation to another process, such as a child the caller started, so
// the port stays reserved exactly as long as that process runs.
//
// Several Allocators in one process share its identity, so the store has
// one row for a port however many of them hold it: a Reserve of a key the
// process already holds, from any Allocator, returns that reservation. Each
// such Reserve, and each Set and Pool that uses the row, takes a hold of
// it, counted process-wide per state store file; Release, Close, Set.Release
// and a failed AllocateSet drop holds, and the row is deleted only when the
// last hold in the process is dropped. So one Allocator's Close never frees
// a port that another Allocator of the process still hands out. Transfer
// refuses a row that anything else in the process holds too.
//
// # After Close
//
// Close is idempotent: a second Close returns nil. Config, Stats, Metrics,
// Backend, FallbackCause and Held stay readable after it (Held is then
// empty, and Metrics reports no Usage). Every other method returns an error
// wrapping ErrClosed: Allocate, AllocateBlock, Reserve, Listen,
// ListenPacket, AllocateSet, NewPool, Release, Transfer, Reap and Usage, and of its pools Take,
// Return and Update (Pool.Close is idempotent too). Set.Release returns nil
// after Close, as it does when there is nothing left to release: Close has
// already released what the set held. What only reads what a set or pool
// already has stays valid too: Set.Members, Set.Member, Set.Manifest,
// Set.WriteManifest, Member.Env, Pool.Status, Pool.Idle and Pool.Err. A
// call in flight when Close runs either completes or returns an error
// wrapping ErrClosed.
//
// # Fallback
//
// In ModeStateStoreWithFallback (the default) a store that cannot be used
// (a damaged or foreign database, a newer schema, a file system that fails)
// makes the Allocator serve from the MRU file, loudly: an error is logged
// (to standard error when Config.Logger is the zero Logger), Stats counts
// it and FallbackCause says why. A busy store (another process holds its
// lock past the time a call can wait) or a call that runs out of time is
// not such a reason: the call fails with an error wrapping
// ErrStoreUnavailable and the context's error, and the next call tries the
// store again. While the MRU file serves, it skips every port the store
// holds as long as the database can still be read (readers need no lock);
// when it cannot be read either, it serves blind, which is logged and
// counted in Stats.Blind. Every StoreRetryInterval the next call tries the
// store again, and the Allocator goes back to it once it works.
//
// # Which port
//
// Allocate walks the range in Config.Order (a random stride, or lowest
// first), after the ports of Request.Prefer; AllocateBlock takes n
// consecutive ports at once.
//
// # Beyond single ports
//
// AllocateSet reserves the named ports of groups of processes and gives each
// member its environment; Listen binds a port inside the reserving
// transaction and Handoff passes the socket to a child; NewPool keeps ports
// reserved ahead of time for hot paths; Stats, Usage and Metrics expose
// metrics, and package expvarmetrics publishes them through expvar. Package
// porttest gives tests their ports.
//
// Importing portalloc (or porttest) has no side effects: it registers no
// HTTP handler, flag or expvar variable.
package portalloc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"slices"
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

// Order is the order in which Allocate tries the ports of its range.
type Order string

const (
	// OrderRandom walks the range from a random port by a random stride,
	// the ports above the range's static band first (see PoolSpec.Band).
	// Allocators racing on one store start in different places, so they
	// rarely want the same port: the default.
	OrderRandom Order = "random"
	// OrderLowest tries the lowest port of the range first, then the next,
	// bands ignored: predictable ports for people who read them. Allocators
	// racing on one store all want the same low ports; the store's write
	// lock makes them take turns, so none is handed out twice, and each
	// skips the ports the others hold from memory, without a probe.
	OrderLowest Order = "lowest"
)

func (o Order) valid() bool { return o == OrderRandom || o == OrderLowest }

// MaxPrefer is the most ports a Request.Prefer may list.
const MaxPrefer = 1024

// Backend names, as reported in Reservation.Backend.
const (
	BackendStateStore = "statestore"
	BackendMRU        = "mru"
)

// Request describes the port a caller wants.
type Request struct {
	Protocol Protocol   // zero: TCP
	Address  netip.Addr // zero: 127.0.0.1; 0.0.0.0 and :: are the wildcards
	// Prefer lists ports for Allocate to try first, in this order, each
	// with the full guarantee (free in the store, bind-probed); when none
	// is free, Allocate goes on with the range as usual. Preferred ports
	// may lie outside Config.Range (a dev server that should land on 3000
	// when it can). At most MaxPrefer ports, none of them 0.
	Prefer []uint16
	// Order overrides Config.Order for this request.
	Order Order
	// Label is the caller's name for the port, shown in listings: at most
	// MaxLabelLen bytes of printable UTF-8 (see MaxLabelLen); zero: none.
	Label string
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
	cfg    Config
	log    logr.Logger
	warn   logr.Logger // fallback warnings: cfg.Logger, or standard error
	set    *portrange.Set
	mru    *mru.File
	dbPath string // the state store's database file
	dbKey  string // dbPath as refKeys name it

	// store is nil in ModeMRU and while the store cannot be opened; a
	// retry after a fallback replaces it.
	store atomic.Pointer[statestore.Store]
	fb    fallback
	bg    sync.WaitGroup // closes of stores a retry replaced

	rngMu sync.Mutex // guards rng
	rng   *rand.Rand

	ctr counters

	mu        sync.Mutex // guards held, pools, poolNames and closed
	held      map[heldKey]*holding
	pools     []*Pool
	poolNames map[string]bool // of the pools open or being made
	closed    bool
}

// heldKey names a reservation an Allocator holds. The backend is part of
// it: a port the MRU file handed out during a fallback and a row of the
// store are different things.
type heldKey struct {
	backend  string
	protocol Protocol
	addr     netip.Addr
	port     uint16
}

// holding is a reservation and how many holds of it the Allocator has:
// its own Reserve calls and those of its sets and pools.
type holding struct {
	r Reservation
	n int
}

func keyOf(r Reservation) heldKey { return heldKey{r.Backend, r.Protocol, r.Address, r.Port} }

var ephemeralWarning sync.Once

// maxBusyWait bounds how long a call waits for a store that another
// program keeps locked.
const maxBusyWait = 5 * time.Second

// New validates cfg and returns an Allocator. In the state-store modes it
// opens (creating if needed) the store in cfg.StateDir, waiting at most
// until ctx is done or cfg.Timeout has passed. A store that is busy (another
// process holds its lock for longer) or that does not open in time is an
// error wrapping ErrStoreUnavailable in every mode, and so is a state
// directory berth refuses as unsafe (an error wrapping ErrUnsafe too: see
// Config.StateDir). A store that cannot be used for another reason (a damaged or foreign file, a newer schema, a
// directory that cannot be written) is an error wrapping
// ErrStoreUnavailable in ModeStateStore; in ModeStateStoreWithFallback the
// Allocator serves from the MRU file instead, loudly, and tries the store
// again every StoreRetryInterval.
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
		cfg:    cfg,
		log:    cfg.Logger,
		warn:   warnLogger(cfg),
		set:    set,
		mru:    mru.New(filepath.Join(cfg.StateDir, MRUFile), mru.Options{Logger: cfg.Logger}),
		dbPath: filepath.Join(cfg.StateDir, DatabaseFile),
		rng:    rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		held:   map[heldKey]*holding{},

		poolNames: map[string]bool{},
	}
	if cfg.Mode == ModeMRU {
		a.fb.active.Store(true)
		return a, nil
	}
	octx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	store, err := a.openStore(octx)
	a.dbKey = canonicalDB(a.dbPath) // after Open, which creates the directory
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if cfg.Mode == ModeStateStore || isTransient(err) || errors.Is(err, ErrUnsafe) {
			return nil, fmt.Errorf("portalloc: %w: %w", ErrStoreUnavailable, err)
		}
		a.fallBack(err)
		return a, nil
	}
	a.store.Store(store)
	return a, nil
}

// candidateSet is the range less exclusions, the OS ephemeral range (unless
// allowed) and the ports the OS reserves for itself.
func candidateSet(cfg Config) (*portrange.Set, error) {
	exclude := internalRanges(cfg.Exclude)
	if !cfg.AllowEphemeralOverlap {
		eph, err := portrange.Ephemeral()
		if err != nil {
			cfg.Logger.Info("could not read the OS ephemeral port range; assuming the IANA range", "range", eph.String(), "error", err.Error())
		}
		if cfg.Range.Overlaps(Range(eph)) {
			ephemeralWarning.Do(func() {
				cfg.Logger.Info("the port range overlaps the OS ephemeral range; leaving the overlap out (set Config.AllowEphemeralOverlap or BERTH_ALLOW_EPHEMERAL_OVERLAP=true to keep it)",
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
	set := portrange.NewSet(portrange.Range(cfg.Range), exclude...)
	if set.Len() == 0 {
		return nil, fmt.Errorf("%w: port range %s (Config.Range, BERTH_PORT_RANGE or --range) has no port left after exclusions and the OS ephemeral range; widen it, or set Config.AllowEphemeralOverlap (BERTH_ALLOW_EPHEMERAL_OVERLAP=true) to keep the overlap", ErrInvalidRequest, cfg.Range)
	}
	return set, nil
}

// Config returns the configuration in effect, with defaults filled in.
func (a *Allocator) Config() Config { return a.cfg }

func (a *Allocator) normalize(req Request) (Request, error) {
	if err := checkLabel(req.Label); err != nil {
		return Request{}, err
	}
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
	switch {
	case req.Order == "":
		req.Order = a.cfg.Order
	case !req.Order.valid():
		return Request{}, fmt.Errorf("%w: Request.Order %q: want \"random\" or \"lowest\"", ErrInvalidRequest, req.Order)
	}
	if len(req.Prefer) > MaxPrefer {
		return Request{}, fmt.Errorf("%w: Request.Prefer lists %d ports: want at most %d", ErrInvalidRequest, len(req.Prefer), MaxPrefer)
	}
	if i := slices.Index(req.Prefer, 0); i >= 0 {
		return Request{}, fmt.Errorf("%w: Request.Prefer[%d] is 0: want ports from 1 to 65535", ErrInvalidRequest, i)
	}
	return req, nil
}

func (a *Allocator) begin(ctx context.Context, req Request) (context.Context, context.CancelFunc, Request, error) {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, nil, Request{}, fmt.Errorf("portalloc: %w", ErrClosed)
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

func (a *Allocator) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// closedErr returns ErrClosed for an error of a store that Close closed
// while the call ran, and err otherwise.
func (a *Allocator) closedErr(err error) error {
	if errors.Is(err, statestore.ErrClosed) && a.isClosed() {
		return ErrClosed
	}
	return err
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
	return a.allocate(ctx, req, a.set, probeFunc(req), "")
}

func probeFunc(req Request) func(uint16) (bool, error) {
	return func(p uint16) (bool, error) {
		return probe.Available(string(req.Protocol), req.Address, p)
	}
}

// allocateIn is allocate with the probe, on a set of ports of the range
// (a pool's), held by via. The caller has run begin.
func (a *Allocator) allocateIn(ctx context.Context, req Request, set *portrange.Set, via string) (r Reservation, err error) {
	defer func() { a.ctr.count(false, err) }()
	return a.allocate(ctx, req, set, probeFunc(req), via)
}

// allocate walks set for req and takes the first port that the backend has
// free and bindable passes. bindable runs inside the store's write
// transaction. via names the holder of the reference it takes (see refs).
func (a *Allocator) allocate(ctx context.Context, req Request, set *portrange.Set, bindable func(uint16) (bool, error), via string) (Reservation, error) {
	a.retryStore(ctx)
	if !a.fb.active.Load() {
		if r, done, err := a.scanStore(ctx, req, set, bindable, via); done {
			return r, err
		}
	}
	return a.allocateMRU(ctx, req, set, bindable)
}

// scanStore allocates in the state store. done is false when the store
// failed and the Allocator fell back: the MRU file is to serve.
func (a *Allocator) scanStore(ctx context.Context, req Request, set *portrange.Set, bindable func(uint16) (bool, error), via string) (r Reservation, done bool, err error) {
	for attempt := 0; ; attempt++ {
		s := a.db()
		if s == nil {
			return Reservation{}, false, nil
		}
		next, sticky := a.candidates(ctx, s, req, set)
		row, err := s.Scan(ctx, statestore.ScanRequest{
			Protocol: req.Protocol,
			Addr:     req.Address,
			Label:    req.Label,
			Next:     next,
			Probe:    func(k statestore.Key) (bool, error) { return bindable(k.Port) },
		})
		if err == nil {
			a.remember(ctx, s, req, sticky, row.Port)
			r := Reservation{Protocol: req.Protocol, Address: row.Addr, Port: row.Port, Label: req.Label, Backend: BackendStateStore}
			if !a.holdNew(ctx, s, r, via) {
				return Reservation{}, true, ErrClosed
			}
			return r, true, nil
		}
		if attempt == 0 && a.replaced(s, err) {
			continue
		}
		if err := a.storeErr(ctx, err, req); err != nil {
			return Reservation{}, true, err
		}
		return Reservation{}, false, nil
	}
}

// holdNew takes this Allocator's hold, on behalf of via, of a row a scan
// has just inserted: nobody else in the process can hold it yet. When the
// Allocator has closed meanwhile, it releases the row and reports false.
func (a *Allocator) holdNew(ctx context.Context, s *statestore.Store, r Reservation, via string) bool {
	rk := a.refKeyOf(r)
	refs.addNew(rk, a, via)
	if a.hold(r) {
		return true
	}
	if refs.forget(rk, a) == 0 {
		_ = s.Release(context.WithoutCancel(ctx), storeKey(r), statestore.Owner{}) // reaping covers a failure
	}
	return false
}

// storeKey is r's key in the state store.
func storeKey(r Reservation) statestore.Key {
	return statestore.Key{Protocol: r.Protocol, Addr: r.Address, Port: r.Port}
}

// replaced reports whether err comes from a store that a retry after a
// fallback has replaced since the call took it: the call goes on with the
// new one.
func (a *Allocator) replaced(s *statestore.Store, err error) bool {
	cur := a.db()
	return errors.Is(err, statestore.ErrClosed) && cur != nil && cur != s
}

// allocateMRU allocates from the MRU file, skipping every port the state
// store holds while its database can be read.
func (a *Allocator) allocateMRU(ctx context.Context, req Request, set *portrange.Set, bindable func(uint16) (bool, error)) (Reservation, error) {
	held, readable := a.readHeld(ctx)
	it, _ := a.candidates(ctx, nil, req, set) // the MRU file remembers no sticky port
	next := func() (uint16, bool) {
		for {
			p, ok := it()
			if !ok || len(held.Holders(statestore.Key{Protocol: req.Protocol, Addr: req.Address, Port: p})) == 0 {
				return p, ok
			}
		}
	}
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
	if !readable {
		a.ctr.blind.Add(1)
	}
	r := Reservation{Protocol: req.Protocol, Address: req.Address, Port: port, Label: req.Label, Backend: BackendMRU}
	if !a.hold(r) {
		return Reservation{}, ErrClosed
	}
	return r, nil
}

// candidates returns the walk over the range in req's order, led by req's
// preferred ports and, before them, the sticky port of a sticky request (0
// when there is none) as s remembers it.
func (a *Allocator) candidates(ctx context.Context, s *statestore.Store, req Request, set *portrange.Set) (func() (uint16, bool), uint16) {
	var it *portrange.Iter
	if req.Order == OrderLowest {
		it = set.Lowest()
	} else {
		a.rngMu.Lock()
		it = set.Candidates(a.rng)
		a.rngMu.Unlock()
	}
	next := it.Next
	if len(req.Prefer) > 0 {
		prefer := req.Prefer
		next = func() (uint16, bool) {
			if len(prefer) > 0 {
				p := prefer[0]
				prefer = prefer[1:]
				return p, true
			}
			return it.Next()
		}
	}
	p := a.stickyPort(ctx, s, req, set)
	if p == 0 {
		return next, 0
	}
	first := true
	return func() (uint16, bool) {
		if first {
			first = false
			return p, true
		}
		return next()
	}, p
}

// stickyPort returns the port a sticky request had last time as s
// remembers it, when it is still in set; 0 otherwise.
func (a *Allocator) stickyPort(ctx context.Context, s *statestore.Store, req Request, set *portrange.Set) uint16 {
	if !req.Sticky || s == nil {
		return 0
	}
	p, ok, err := s.Recall(ctx, req.Label, req.Protocol)
	switch {
	case err != nil:
		a.log.Error(err, "could not recall the sticky port; allocating afresh", "label", req.Label)
		return 0
	case !ok:
		return 0
	case !set.Contains(p):
		a.log.Info("sticky port is outside the range now; allocating afresh", "label", req.Label, "port", p, "range", a.cfg.Range.String())
		return 0
	}
	return p
}

// remember records a sticky request's port, and logs when it is not the
// one it had before.
func (a *Allocator) remember(ctx context.Context, s *statestore.Store, req Request, sticky, got uint16) {
	if !req.Sticky {
		return
	}
	if sticky != 0 && sticky != got {
		a.log.Info("sticky port was not free (held or bound by another process); allocated another", "label", req.Label, "was", sticky, "now", got)
	}
	if err := s.Remember(ctx, req.Label, req.Protocol, got); err != nil {
		a.log.Error(err, "could not remember the sticky port", "label", req.Label)
	}
}

// Reserve reserves the given port for req, whether or not it lies in the
// configured range. It returns a *ConflictError (errors.Is ErrPortHeld) when
// another process holds it, or when this process already holds a
// conflicting reservation (such as its own wildcard on the port). Reserving
// a port this process already holds on the same address returns it again,
// and takes another hold of it: the row stays until every Allocator, set
// and pool of the process that holds it has released it (see the package
// documentation).
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
	return a.reserve(ctx, req, port, "")
}

// reserve is Reserve after begin, with the hold taken by via.
func (a *Allocator) reserve(ctx context.Context, req Request, port uint16, via string) (Reservation, error) {
	a.retryStore(ctx)
	if !a.fb.active.Load() {
		if r, done, err := a.reserveStore(ctx, req, port, via); done {
			return r, err
		}
	}
	return a.reserveMRU(ctx, req, port)
}

// reserveStore reserves in the state store. done is false when the store
// failed and the Allocator fell back.
func (a *Allocator) reserveStore(ctx context.Context, req Request, port uint16, via string) (r Reservation, done bool, err error) {
	key := statestore.Key{Protocol: req.Protocol, Addr: req.Address, Port: port}
	rk := refKey{store: a.dbKey, protocol: req.Protocol, addr: req.Address, port: port}
	// The key's turn keeps a release by another holder of the process from
	// deleting the row between the store returning it and the hold below.
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return Reservation{}, true, err
	}
	defer refs.unlock(rk, e)
	for attempt := 0; ; attempt++ {
		s := a.db()
		if s == nil {
			return Reservation{}, false, nil
		}
		row, err := s.Reserve(ctx, statestore.Request{Key: key, Label: req.Label, Kind: statestore.Static, Probe: probeKey})
		if err == nil {
			r := Reservation{Protocol: req.Protocol, Address: row.Addr, Port: row.Port, Label: row.Label, Backend: BackendStateStore}
			refs.add(e, a, via)
			if !a.hold(r) {
				if _, left := refs.drop(e, a, via); left == 0 {
					_ = s.Release(context.WithoutCancel(ctx), key, statestore.Owner{}) // reaping covers a failure
				}
				return Reservation{}, true, ErrClosed
			}
			return r, true, nil
		}
		if attempt == 0 && a.replaced(s, err) {
			continue
		}
		if err := a.storeErr(ctx, err, req); err != nil {
			return Reservation{}, true, err
		}
		return Reservation{}, false, nil
	}
}

// reserveMRU reserves a port without the state store: it refuses a port
// the store holds for a live process while the database can be read, and
// one that cannot be bound.
func (a *Allocator) reserveMRU(ctx context.Context, req Request, port uint16) (Reservation, error) {
	held, readable := a.readHeld(ctx)
	key := statestore.Key{Protocol: req.Protocol, Addr: req.Address, Port: port}
	if holders := held.Holders(key); len(holders) > 0 {
		self, _ := statestore.Self() // without it no holder is this process
		for _, h := range holders {
			if h.Owner.Alive(ctx) {
				return Reservation{}, &ConflictError{Key: key, Holder: h, Self: h.Owner.Same(self)}
			}
		}
	}
	free, err := probe.Available(string(req.Protocol), req.Address, port)
	if err != nil {
		return Reservation{}, a.probeErr(err, req)
	}
	if !free {
		a.ctr.mruProbeFailures.Add(1)
		return Reservation{}, &ConflictError{Key: key}
	}
	if err := a.mru.Record(ctx, string(req.Protocol), port); err != nil {
		a.log.Error(err, "could not record a reserved port in the MRU file", "port", port)
	}
	if !readable {
		a.ctr.blind.Add(1)
	}
	r := Reservation{Protocol: req.Protocol, Address: req.Address, Port: port, Label: req.Label, Backend: BackendMRU}
	if !a.hold(r) {
		return Reservation{}, ErrClosed
	}
	return r, nil
}

// storeErr translates a state store error. It returns nil when the caller
// should go on with the MRU file: a failure of the store, not of the
// request, in the fallback mode. A busy store and a call out of time are
// never reasons to fall back: the store works, it only has to be waited
// for, and the MRU file reserves nothing.
func (a *Allocator) storeErr(ctx context.Context, err error, req Request) error {
	var ce *ConflictError
	switch {
	case errors.As(err, &ce):
		return ce
	case errors.Is(err, statestore.ErrExhausted):
		return fmt.Errorf("portalloc: %s on %s in %s: %w", req.Protocol, req.Address, a.cfg.Range, ErrRangeExhausted)
	case errors.Is(ctx.Err(), context.Canceled):
		return ctx.Err() // the caller gave up
	case ctx.Err() != nil && !isTransient(err):
		return ctx.Err()
	case isTransient(err) || ctx.Err() != nil:
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w: %w", err, ctxErr)
		}
		return fmt.Errorf("portalloc: %w (gave up waiting; it is not damaged, and berth does not fall back for it): %w", ErrStoreUnavailable, err)
	case errors.Is(err, ErrUnsafe):
		return fmt.Errorf("portalloc: %w: %w", ErrStoreUnavailable, err) // to fix, never to fall back for
	case errors.Is(err, statestore.ErrInvalid):
		return fmt.Errorf("portalloc: %w: %w", ErrInvalidRequest, err)
	case errors.Is(err, statestore.ErrClosed) && a.isClosed():
		return ErrClosed
	case errors.Is(err, statestore.ErrStorage) || errors.Is(err, statestore.ErrClosed) ||
		errors.Is(err, statestore.ErrDamaged) || errors.Is(err, statestore.ErrSchemaTooNew):
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

// hold records one more hold of r by the Allocator. It returns false when
// the Allocator has been closed meanwhile.
func (a *Allocator) hold(r Reservation) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	k := keyOf(r)
	if h := a.held[k]; h != nil {
		h.n++
	} else {
		a.held[k] = &holding{r: r, n: 1}
	}
	a.log.V(1).Info("reserved port", "protocol", string(r.Protocol), "address", r.Address.String(), "port", r.Port, "label", r.Label, "backend", r.Backend)
	return true
}

// unhold removes one hold of r, or all of them.
func (a *Allocator) unhold(r Reservation, all bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := keyOf(r)
	if h := a.held[k]; h != nil {
		if h.n--; h.n <= 0 || all {
			delete(a.held, k)
		}
	}
}

// adopt takes a hold, by via, of r: a row this process already has in the
// store (an AllocateSet found it by its label).
func (a *Allocator) adopt(ctx context.Context, r Reservation, via string) (Reservation, error) {
	if r.Backend != BackendStateStore {
		if !a.hold(r) {
			return Reservation{}, ErrClosed
		}
		return r, nil
	}
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return Reservation{}, err
	}
	defer refs.unlock(rk, e)
	refs.add(e, a, via)
	if !a.hold(r) {
		refs.drop(e, a, via)
		return Reservation{}, ErrClosed
	}
	return r, nil
}

// Release gives r back. It never needs to fail the caller: the error it
// returns is for logging, and a reservation that could not be released is
// reaped once this process exits.
//
// It releases one hold of r by this Allocator. The row is deleted only when
// no other hold of it remains in this process: another Reserve of the same
// port, a set or pool of this or another Allocator. Releasing a reservation
// this Allocator does not hold while another holder of the process does is
// an error, and deletes nothing.
func (a *Allocator) Release(ctx context.Context, r Reservation) error {
	return a.release(ctx, r, "", false)
}

// release drops one hold of r by via. With keepRow it never deletes the
// row: an AllocateSet that fails leaves rows that existed before it.
func (a *Allocator) release(ctx context.Context, r Reservation, via string, keepRow bool) error {
	if a.isClosed() {
		return fmt.Errorf("portalloc: release %s: %w (Close has released everything the Allocator held)", r, ErrClosed)
	}
	switch r.Backend {
	case BackendMRU:
		// The MRU file keeps the port as recently handed out until it expires.
		a.unhold(r, false)
		return nil
	case BackendStateStore:
	default:
		return fmt.Errorf("%w: reservation backend %q: want %q or %q", ErrInvalidRequest, r.Backend, BackendStateStore, BackendMRU)
	}
	s := a.db()
	if s == nil {
		return fmt.Errorf("%w: reservation %s is from a state store this Allocator does not have", ErrInvalidRequest, r)
	}
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return fmt.Errorf("portalloc: release %s: %w", r, err)
	}
	defer refs.unlock(rk, e)
	had, left := refs.drop(e, a, via)
	if had > 0 {
		a.unhold(r, false)
	}
	switch {
	case left > 0 && had > 0:
		a.log.V(1).Info("released a hold; the port stays reserved for the other holders in this process", "reservation", r.String(), "holds", left)
		return nil
	case left > 0:
		return fmt.Errorf("portalloc: release %s: %w: this Allocator does not hold it; %s holds it and releases it", r, ErrInvalidRequest, refs.describe(e, a, via))
	case keepRow:
		return nil
	}
	// The last hold in this process, or a row nobody here tracks (made by
	// an Allocator since closed, or handed to this process).
	if err := s.Release(ctx, storeKey(r), statestore.Owner{}); err != nil {
		return a.rowErr("release", r, err)
	}
	return nil
}

// Transfer hands r to the running process pid, typically a child the caller
// has just started: the port then stays reserved exactly as long as that
// process runs, even if the caller exits first, and Close no longer
// releases it. Reservations of the MRU backend have no owner; for them
// Transfer only stops this Allocator from tracking the port.
//
// A row is owned by the process, not by one Allocator: Transfer refuses,
// with an error wrapping ErrInvalidRequest that names the other holders,
// when anything else in this process holds r too (another Allocator, a set
// or pool, or a second Reserve of the same port), since the transfer would
// take the port from them.
func (a *Allocator) Transfer(ctx context.Context, r Reservation, pid int) error {
	return a.transfer(ctx, r, pid, "")
}

func (a *Allocator) transfer(ctx context.Context, r Reservation, pid int, via string) error {
	if a.isClosed() {
		return fmt.Errorf("portalloc: transfer %s: %w", r, ErrClosed)
	}
	switch r.Backend {
	case BackendMRU:
		a.unhold(r, true)
		return nil
	case BackendStateStore:
	default:
		return fmt.Errorf("%w: reservation backend %q: want %q or %q", ErrInvalidRequest, r.Backend, BackendStateStore, BackendMRU)
	}
	s := a.db()
	if s == nil {
		return fmt.Errorf("%w: reservation %s is from a state store this Allocator does not have", ErrInvalidRequest, r)
	}
	to, err := statestore.LookupOwner(ctx, pid)
	if err != nil {
		return fmt.Errorf("portalloc: transfer %s: %w: pid %d is not a running process: %w", r, ErrInvalidRequest, pid, err)
	}
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		return fmt.Errorf("portalloc: transfer %s to pid %d: %w", r, pid, err)
	}
	defer refs.unlock(rk, e)
	if mine, all := refs.count(e, a); all > 1 || all > mine {
		return fmt.Errorf("portalloc: transfer %s to pid %d: %w", r, pid, sharedError(r, refs.describe(e, a, via)))
	}
	key := storeKey(r)
	if err := s.Transfer(ctx, key, statestore.Owner{}, to); err != nil {
		return a.rowErr(fmt.Sprintf("transfer to pid %d of", pid), r, err)
	}
	refs.dropAll(e, a)
	a.unhold(r, true)
	return nil
}

// Reap deletes every reservation in the store whose owner has exited, for
// example those of children that were handed ports and have stopped, and
// returns how many it deleted. The store also reaps on its own, in the
// background and whenever a dead owner's row stands in the way; Reap just
// does it now. In the MRU backend there is nothing to reap.
func (a *Allocator) Reap(ctx context.Context) (int, error) {
	if a.isClosed() {
		return 0, fmt.Errorf("portalloc: reap: %w", ErrClosed)
	}
	s := a.db()
	if s == nil {
		return 0, nil
	}
	n, err := s.Reap(ctx)
	if err != nil {
		return n, fmt.Errorf("portalloc: reap: %w", a.closedErr(err))
	}
	return n, nil
}

// Held returns the reservations this Allocator holds: made by it (or its
// sets and pools) and not yet released or transferred, each once. After
// Close it returns none.
func (a *Allocator) Held() []Reservation {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Reservation, 0, len(a.held))
	for _, h := range a.held {
		out = append(out, h.r)
	}
	return out
}

// Close closes the Allocator's pools, drops every hold it still has (the
// rows no other holder of this process holds are released) and closes the
// state store. Later calls return errors wrapping ErrClosed (see "After
// Close" in the package documentation); Close itself is idempotent.
//
// Close is bounded: the pools and the releases share one deadline of
// Config.Timeout, and closing the store then waits at most for a call still
// in flight on it, which is bounded by the store's busy timeout. Its error
// is for logging: what it could not release is reaped once this process
// exits.
func (a *Allocator) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	pools := a.pools
	a.pools = nil
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	// Pools first, while their idle members can still be released.
	var errs []error
	for _, p := range pools {
		if err := p.close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	a.mu.Lock()
	a.closed = true
	held := a.held
	a.held = nil
	a.mu.Unlock()

	s := a.db()
	for _, h := range held {
		if h.r.Backend != BackendStateStore || s == nil {
			continue
		}
		if err := a.dropHolds(ctx, s, h.r); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", h.r, err))
		}
	}
	a.bg.Wait() // stores replaced after a fallback: each Close is bounded
	if s != nil {
		errs = append(errs, s.Close())
	}
	errs = append(errs, a.mru.Close()) // its lock file, kept open between calls
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("portalloc: close: %w", err)
	}
	return nil
}

// dropHolds drops every hold of r by the Allocator, and releases the row if
// nobody else in the process holds it.
func (a *Allocator) dropHolds(ctx context.Context, s *statestore.Store, r Reservation) error {
	rk := a.refKeyOf(r)
	e, err := refs.lock(ctx, rk)
	if err != nil {
		// Out of time: forget the holds anyway, so that the others'
		// counts stay right; the row is reaped after this process exits.
		refs.forget(rk, a)
		return err
	}
	defer refs.unlock(rk, e)
	if refs.dropAll(e, a) > 0 {
		return nil
	}
	return s.Release(ctx, storeKey(r), statestore.Owner{})
}
