package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// A fleet worker holds fleet-wide ports (pgstore.ReserveFleet: rows of no
// host, held under a lease) and binds each in the namespace of every host
// of the run, while the hosts' workers go on: a port the store handed to
// a host's worker while a fleet worker held it fails one of the two binds.
const (
	envNetns = "BERTH_TORTURE_NETNS" // a fleet worker's hosts: their namespaces, host-1 first, comma-separated

	// fleetStoreHost is the host name of the fleet workers' stores; a
	// fleet-wide grant is on no host, so it plays no part in them.
	fleetStoreHost = "torture-fleet"
	// fleetTTL is the lease of a fleet-wide grant, renewed after
	// fleetRenew: a worker killed holding one keeps its port off every
	// host until the lease runs out and a host's Reap deletes it.
	fleetTTL     = 10 * time.Second
	fleetRenew   = 2 * time.Second
	maxFleetHeld = 4
)

// fleetHeld is a fleet-wide grant with its sockets, one per host.
type fleetHeld struct {
	r       pgstore.FleetReservation
	socks   []io.Closer
	renewed time.Time
}

type fleetWorker struct {
	workerEnv // rangeOf: the band of its grants
	st        *pgstore.Store
	hosts     []netns.NS
	n         int // grants asked for, for the holders' names
	held      []*fleetHeld
}

// runFleetWorker loops taking, renewing and releasing fleet-wide ports
// until its stdin closes, then releases everything and exits.
func runFleetWorker() error {
	env, ctx, cancel, err := startWorker()
	if err != nil {
		return err
	}
	defer func() { _ = env.log.f.Close() }()
	defer cancel()
	log, timeout := env.log, env.timeout
	var hosts []netns.NS
	for _, name := range strings.Split(os.Getenv(envNetns), ",") {
		hosts = append(hosts, netns.NS{Name: name})
	}
	var st *pgstore.Store
	for {
		// A lease of its own, as a controller's Store has: the grace
		// period after a change of server waits for it to put back the
		// leases it holds.
		st, err = pgstore.Open(ctx, os.Getenv(envStore), pgstore.Options{Host: fleetStoreHost, Timeout: timeout, SweepInterval: -1})
		if err == nil || !env.faults || !unavailable(err) || ctx.Err() != nil {
			break
		}
		// The server is restarting or failing over.
		log.add(Event{Kind: KindCall, Op: "open", Unavailable: true, Err: err.Error()})
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		log.add(Event{Kind: KindError, Err: err.Error()})
		return err
	}
	w := &fleetWorker{workerEnv: env, st: st, hosts: hosts}
	for ctx.Err() == nil {
		w.step(ctx)
	}
	for len(w.held) > 0 {
		w.release(ctx, w.held[0])
	}
	log.add(Event{Kind: KindExit})
	return st.Close()
}

func (w *fleetWorker) step(ctx context.Context) {
	if err := w.st.Check(ctx); errors.Is(err, store.ErrLost) {
		// The store changed server, or its routine renewal says to
		// compare: renewing every lease puts back, in the grace period
		// after a change of server, those the change lost.
		w.reassert(ctx)
	}
	w.renewDue(ctx)
	switch n := w.rng.IntN(100); {
	case n < 40 && len(w.held) < maxFleetHeld:
		w.grant(ctx)
	case n < 70 && len(w.held) > 0:
		w.release(ctx, w.held[w.rng.IntN(len(w.held))])
	}
	// The hosts' workers do the heavy lifting; this one paces itself.
	time.Sleep(time.Duration(2+w.rng.IntN(20)) * time.Millisecond)
}

// grant takes a fleet-wide port of the run's range and binds it on every
// host; a bind that fails is a violation, and the port is given back.
func (w *fleetWorker) grant(ctx context.Context) {
	proto := store.TCP
	if w.rng.IntN(2) == 0 {
		proto = store.UDP
	}
	w.n++
	req := pgstore.FleetRequest{Protocol: proto, Addr: addrs[w.rng.IntN(len(addrs))], Band: w.rangeOf,
		Holder: fmt.Sprintf("torture/%s/%d", w.proc, w.n), Label: "torture-fleet", TTL: fleetTTL}
	start := time.Now()
	var r pgstore.FleetReservation
	err := timedCall(ctx, w.log, w.timeout, "reserve-fleet", func(ctx context.Context) (err error) {
		r, err = w.st.ReserveFleet(ctx, req)
		return err
	}, w.faults)
	switch {
	case err == nil:
	case errors.Is(err, store.ErrExhausted):
		w.log.add(Event{Kind: KindExhausted, Fleet: true, DurNS: int64(time.Since(start))})
		return
	case ctx.Err() != nil, timedOut(err), errors.Is(err, store.ErrGrace), w.faults && unavailable(err):
		return
	default:
		w.log.add(Event{Kind: KindError, Err: "reserve fleet-wide: " + err.Error()})
		return
	}
	h := &fleetHeld{r: r, renewed: time.Now()}
	w.log.add(Event{Kind: KindGrant, Fleet: true, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, DurNS: int64(time.Since(start))})
	for i, ns := range w.hosts {
		var sock io.Closer
		err := ns.Do(func() (err error) {
			sock, err = bind(store.Reservation{Key: r.Key})
			return err
		})
		e := Event{Kind: KindBind, Fleet: true, Host: hostName(i), Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port}
		if err != nil {
			e.Err = err.Error()
			w.log.add(e)
			// It gives the grant back: its claim ends here, and the
			// failure counts once.
			w.release(ctx, h)
			return
		}
		w.log.add(e)
		h.socks = append(h.socks, sock)
	}
	w.held = append(w.held, h)
}

// release closes h's sockets on every host, logs, then releases the
// lease: the claim ends before any host can be granted the port.
func (w *fleetWorker) release(ctx context.Context, h *fleetHeld) {
	for _, s := range h.socks {
		_ = s.Close()
	}
	w.log.add(Event{Kind: KindRelease, Fleet: true, Proto: string(h.r.Protocol), Addr: h.r.Addr.String(), Port: h.r.Port})
	w.held = slices.DeleteFunc(w.held, func(x *fleetHeld) bool { return x == h })
	err := timedCall(context.WithoutCancel(ctx), w.log, w.timeout, "release-fleet", func(ctx context.Context) error {
		return w.st.ReleaseFleet(ctx, h.r.Key, h.r.Holder)
	}, w.faults)
	// With the server faults, a lease granted just before a failover may
	// be gone with it (and not put back: the worker let it go first).
	if err != nil && !timedOut(err) && (!w.faults || (!unavailable(err) && !errors.Is(err, store.ErrNotFound))) {
		w.log.add(Event{Kind: KindError, Err: "release fleet-wide: " + err.Error()})
	}
}

// reassert renews every lease the worker holds, now: its holder's
// re-assertion after a change of server. A renewal that fails for the
// server is tried again at the next check.
func (w *fleetWorker) reassert(ctx context.Context) {
	for _, h := range w.held {
		h.renewed = time.Time{} // due
	}
	w.renewDue(ctx)
	var renewed int64
	for _, h := range w.held {
		if !h.renewed.IsZero() {
			renewed++
		}
	}
	w.log.add(Event{Kind: KindRepair, Fleet: true, Restored: renewed})
}

// renewDue renews the leases renewed longer than fleetRenew ago. A lease
// that is gone while its sockets are held would let a host have the port:
// an error.
func (w *fleetWorker) renewDue(ctx context.Context) {
	for _, h := range w.held {
		if time.Since(h.renewed) < fleetRenew {
			continue
		}
		err := timedCall(ctx, w.log, w.timeout, "renew-fleet", func(ctx context.Context) error {
			return w.st.RenewFleet(ctx, h.r.Key, h.r.Holder, fleetTTL)
		}, w.faults)
		switch {
		case err == nil:
			h.renewed = time.Now()
		case ctx.Err() != nil, timedOut(err), w.faults && unavailable(err):
		case w.faults && errors.Is(err, store.ErrGrace):
			// Put back after a change of server, it met a row released
			// before the change that the change brought back: its holder
			// releases it again; this renewal is tried again.
		default:
			w.log.add(Event{Kind: KindError, Err: "renew fleet-wide: " + err.Error()})
		}
	}
}
