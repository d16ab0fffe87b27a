package portalloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

// A grant takes, for the key a store's write is about to record, the key's
// kernel lock and then a bind-probe (or a bind, for Listen), inside that
// write: no other berth process, whatever its store, can be granted a
// conflicting key while the lock is held, and none can choose the key
// between the probe and the row. The locks a grant takes are kept by the
// locker until the grant is settled: those of the rows made go into the
// record (or to the keeper of a named holder), the others are let go.

// locker takes the locks of a grant.
type locker struct {
	// check bind-probes a key whose lock is held: an error wrapping
	// store.ErrHeld when the port is bound outside berth.
	check func(store.Key) error
	taken map[store.Key]*portlock.Lock
	log   logr.Logger
}

func newLocker(check func(store.Key) error, log logr.Logger) *locker {
	return &locker{check: check, taken: map[store.Key]*portlock.Lock{}, log: log}
}

// probe is the store's probe: the lock, then check.
func (l *locker) probe(k store.Key) error {
	lk, err := portlock.Acquire(string(k.Protocol), k.Addr, k.Port)
	if err != nil {
		return lockErr(k, err)
	}
	if err := l.check(k); err != nil {
		_ = lk.Close()
		var ce *store.ConflictError
		if errors.As(err, &ce) && ce.Bound {
			l.log.V(1).Info("port bound outside berth", "key", k.String())
		}
		return err
	}
	l.taken[k] = lk
	return nil
}

// keep returns the locks of keys and lets go of every other.
func (l *locker) keep(keys []store.Key) []*portlock.Lock {
	out := make([]*portlock.Lock, len(keys))
	for i, k := range keys {
		out[i] = l.taken[k]
		delete(l.taken, k)
	}
	l.closeAll()
	return out
}

func (l *locker) closeAll() {
	for k, lk := range l.taken {
		_ = lk.Close()
		delete(l.taken, k)
	}
}

// lockErr puts a lock's refusal into a *store.ConflictError whose holder,
// the conflicting key, has no owner this store knows; any other error (out
// of descriptors, say) is returned as it is.
func lockErr(k store.Key, err error) error {
	var he *portlock.HeldError
	if !errors.As(err, &he) {
		return err
	}
	in := k
	switch {
	case he.In.IsValid():
		in.Addr = he.In
	case he.Slots:
	default:
		in.Addr = k.Addr // a specific address of the port, which the lock does not tell
	}
	return &store.ConflictError{Key: k, Holder: store.Reservation{Key: in}}
}

// probeCheck is the check of an allocation: a bind-probe.
func probeCheck(k store.Key) error {
	free, err := portlock.Probe(string(k.Protocol), k.Addr, k.Port)
	if err != nil {
		return err
	}
	if !free {
		return &store.ConflictError{Key: k, Bound: true}
	}
	return nil
}

// fromMRU reports whether a's grant is to come from the MRU file: in
// ModeMRU, and in the fallback mode while the store is down. The caller
// holds turn.
func (h *handle) fromMRU(ctx context.Context, a *Allocator) bool {
	switch {
	case h.mru == nil:
		return false
	case a.cfg.Mode == ModeMRU:
		return true
	}
	return a.cfg.Mode == ModeStateStoreWithFallback && !h.usable(ctx)
}

// fallsBack reports whether err of the store makes a's grant fall back to
// the MRU file, having taken the store out of service: a failure of the
// store, not of the request, in the fallback mode. Waiting is never a
// reason (a busy store, a shortage, a call out of time): the MRU file would
// meet the same, and the store works once it has passed. The caller holds
// turn.
func (h *handle) fallsBack(a *Allocator, err error) bool {
	if h.mru == nil || a.cfg.Mode != ModeStateStoreWithFallback || transient(err) || errors.Is(err, store.ErrUnsafe) {
		return false
	}
	if errors.Is(err, store.ErrStorage) || errors.Is(err, store.ErrDamaged) || errors.Is(err, store.ErrSchemaTooNew) || errors.Is(err, store.ErrUnavailable) {
		if h.s != nil {
			h.fail(err)
			a.fallBack(err)
		}
		return true
	}
	return false
}

// reserve reserves req.Key for a (req.Owner zero) or for a named holder.
// check bind-probes the key once its lock is held. A key the process holds
// already gets one more hold of a.
func (h *handle) reserve(ctx context.Context, a *Allocator, req store.Request, check func(store.Key) error) (store.Reservation, error) {
	if err := h.lockTurn(ctx); err != nil {
		return store.Reservation{}, err
	}
	defer h.unlockTurn()
	if a.closed.Load() {
		return store.Reservation{}, store.ErrClosed
	}
	if req.Owner.IsZero() {
		h.mu.Lock()
		e := h.held[req.Key]
		if e != nil && e.released.IsZero() {
			e.by[a]++
			h.mu.Unlock()
			return e.row, nil
		}
		h.mu.Unlock()
	}
	l := newLocker(check, h.log)
	if !h.fromMRU(ctx, a) {
		var row store.Reservation
		err := h.do(ctx, func(s store.Store) error {
			l.closeAll()
			req.Probe = l.probe
			var err error
			row, err = s.Reserve(ctx, req)
			return err
		})
		if err == nil {
			rows, err := h.settle(ctx, a, req.Owner, req.TTL, []store.Reservation{row}, l.keep([]store.Key{row.Key}), false)
			if err != nil {
				return store.Reservation{}, err
			}
			return rows[0], nil
		}
		l.closeAll()
		if !h.fallsBack(a, err) {
			return store.Reservation{}, h.conflict(err)
		}
	}
	if !req.Owner.IsZero() {
		return store.Reservation{}, h.noLease()
	}
	// The MRU file: the lock and the probe, and a line of the file.
	if err := l.probe(req.Key); err != nil {
		return store.Reservation{}, h.conflict(err)
	}
	if err := h.mru.Record(ctx, string(req.Protocol), req.Port); err != nil {
		h.log.Error(err, "could not record a reserved port in the MRU file", "port", req.Port)
	}
	row := store.Reservation{Key: req.Key, Owner: h.self, Label: req.Label, Kind: store.Static, Created: time.Now()}
	return h.settleMRU(ctx, a, row, l.keep([]store.Key{req.Key})[0])
}

// scan reserves the first free candidate of req for a (req.Owner zero) or
// for a named holder; n > 0 reserves a block of n consecutive ports.
func (h *handle) scan(ctx context.Context, a *Allocator, req store.ScanRequest, n int, check func(store.Key) error) ([]store.Reservation, error) {
	if err := h.lockTurn(ctx); err != nil {
		return nil, err
	}
	defer h.unlockTurn()
	if a.closed.Load() {
		return nil, store.ErrClosed
	}
	l := newLocker(check, h.log)
	if !h.fromMRU(ctx, a) {
		var rows []store.Reservation
		err := h.do(ctx, func(s store.Store) error {
			l.closeAll()
			req.Probe = l.probe
			if n == 0 {
				r, err := s.Scan(ctx, req)
				rows = []store.Reservation{r}
				return err
			}
			var err error
			rows, err = s.ScanBlock(ctx, req, n)
			return err
		})
		if err == nil {
			keys := make([]store.Key, len(rows))
			for i, r := range rows {
				keys[i] = r.Key
			}
			return h.settle(ctx, a, req.Owner, req.TTL, rows, l.keep(keys), true)
		}
		l.closeAll()
		if !h.fallsBack(a, err) {
			return nil, h.conflict(err)
		}
	}
	switch {
	case !req.Owner.IsZero():
		return nil, h.noLease()
	case n > 0:
		return nil, fmt.Errorf("%w (%w), and the MRU file hands out single ports only", store.ErrUnavailable, h.cause(a))
	}
	key := store.Key{Protocol: req.Protocol, Addr: req.Addr}
	port, err := h.mru.Allocate(ctx, mru.Request{
		Protocol: string(req.Protocol),
		Addr:     req.Addr,
		Next:     req.Next,
		Probe: func(p uint16) (bool, error) {
			k := key
			k.Port = p
			err := l.probe(k)
			if errors.Is(err, store.ErrHeld) {
				return false, nil
			}
			return err == nil, err
		},
	})
	if err != nil {
		l.closeAll()
		if errors.Is(err, mru.ErrExhausted) {
			err = fmt.Errorf("%w: %w", store.ErrExhausted, err)
		}
		return nil, err
	}
	key.Port = port
	row := store.Reservation{Key: key, Owner: h.self, Label: req.Label, Kind: store.Dynamic, Created: time.Now()}
	r, err := h.settleMRU(ctx, a, row, l.keep([]store.Key{key})[0])
	if err != nil {
		return nil, err
	}
	return []store.Reservation{r}, nil
}

// cause says why a's grants come from the MRU file.
func (h *handle) cause(a *Allocator) error {
	if a.cfg.Mode == ModeMRU || h.down == nil {
		return errors.New("Config.Mode is mru")
	}
	return h.down
}

// noLease is the error of a named holder's grant while the store is down:
// the MRU file keeps no holder.
func (h *handle) noLease() error {
	return fmt.Errorf("%w: a named holder's reservation needs the state store (%w)", store.ErrUnavailable, h.downErr())
}

// settle records rows, just made by a grant of a with locks, as the
// process's, each held once by a; or hands the locks to the keeper of the
// named holder own, for ttl. When a was closed meanwhile, the rows are
// released again and the grant fails with store.ErrClosed. scanned says the
// rows are new (a scan only makes rows); a Reserve may return a row this
// process had, whose lock it then takes without a probe.
func (h *handle) settle(ctx context.Context, a *Allocator, own store.Owner, ttl time.Duration, rows []store.Reservation, locks []*portlock.Lock, scanned bool) ([]store.Reservation, error) {
	if own.Holder != "" {
		if err := h.keepFor(portlock.HolderKeeper(own.Holder), ttl, locks); err != nil {
			// No keeper holds the locks: the grant is undone rather than
			// left to a row that a lost store would take with it.
			for _, r := range rows {
				_ = h.do(context.WithoutCancel(ctx), func(s store.Store) error { return s.Release(ctx, r.Key, own) })
			}
			return nil, err
		}
		return rows, nil
	}
	if a.closed.Load() {
		for i, r := range rows {
			_ = h.do(context.WithoutCancel(ctx), func(s store.Store) error { return s.Release(ctx, r.Key, store.Owner{}) })
			if locks[i] != nil {
				_ = locks[i].Close()
			}
		}
		return nil, store.ErrClosed
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, r := range rows {
		lk := locks[i]
		if lk == nil && !scanned {
			// A row of this process's that the record lacked: its lock,
			// without a probe (the process may be listening on the port).
			// Held elsewhere (by the keeper of this very process), it
			// stays there.
			lk, _ = portlock.Acquire(string(r.Protocol), r.Addr, r.Port)
		}
		h.held[r.Key] = &holding{row: r, lock: lk, by: map[*Allocator]int{a: 1}}
	}
	return rows, nil
}

// settleMRU records a port the MRU file handed out, held by a.
func (h *handle) settleMRU(_ context.Context, a *Allocator, row store.Reservation, lk *portlock.Lock) (store.Reservation, error) {
	if a.closed.Load() {
		_ = lk.Close()
		return store.Reservation{}, store.ErrClosed
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held[row.Key] = &holding{row: row, lock: lk, mru: true, by: map[*Allocator]int{a: 1}}
	return row, nil
}

// keepFor hands copies of locks to k and then lets go of this process's.
// Where no keeper can run (ErrNoKeeper: systems other than Linux) the
// reservation is kept by its row alone, as documented, and that is logged
// at V(1). A keeper that should run and cannot take them (out of
// descriptors, say) is an error, and the locks stay this process's.
func (h *handle) keepFor(k portlock.Keeper, ttl time.Duration, locks []*portlock.Lock) error {
	var live []*portlock.Lock
	for _, lk := range locks {
		if lk != nil {
			live = append(live, lk)
		}
	}
	if len(live) == 0 {
		return nil
	}
	if err := k.Hold(ttl, live...); err != nil {
		if !errors.Is(err, portlock.ErrNoKeeper) {
			for _, lk := range live {
				_ = lk.Close()
			}
			return fmt.Errorf("%w: %s could not take the reservation's lock: %w", keeperErr(err), k, err)
		}
		h.log.V(1).Info("no keeper on this system: the reservation is kept by its row in the store alone", "keeper", k.String())
	}
	for _, lk := range live {
		_ = lk.Close()
	}
	return nil
}

// keeperErr is the sentinel of a keeper that could not take locks: a
// passing shortage (descriptors, processes) is store.ErrTransient, to be
// tried again; anything else store.ErrUnavailable.
func keeperErr(err error) error {
	if transient(err) {
		return store.ErrTransient
	}
	return store.ErrUnavailable
}

// conflict completes a store's *store.ConflictError whose holder the store
// does not know (a lock held without a row in it): the process's own
// reservation when it is one of the record, a process's lock otherwise.
// Any other error is returned as it is.
func (h *handle) conflict(err error) error {
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Holder.Owner.IsZero() || ce.Bound {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, e := range h.held {
		if e.released.IsZero() && k.Conflicts(ce.Key) {
			ce.Holder, ce.Self = e.row, true
			return err
		}
	}
	return err
}

// whoLocks fills in the processes that hold the lock in ce's way: a look
// at every process of the host, for a conflict reported to people.
func whoLocks(ce *store.ConflictError) {
	if ce.Bound || ce.Self || !ce.Holder.Owner.IsZero() {
		return
	}
	held, err := portlock.List()
	if err != nil {
		return
	}
	for _, l := range held {
		if l.Network != string(ce.Key.Protocol) || l.Port != ce.Key.Port {
			continue
		}
		if !l.Addr.IsValid() || ce.Key.Addr.IsUnspecified() || l.Addr == ce.Key.Addr {
			ce.PIDs = append(ce.PIDs, l.PIDs...)
		}
	}
	slices.Sort(ce.PIDs)
	ce.PIDs = slices.Compact(ce.PIDs)
}
