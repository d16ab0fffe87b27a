package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/berth-go/berth/store"
)

const maxLeases = 4

// leased is a port a worker holds through a named holder's lease
// (-leases): the reservation is the holder's, not the worker's, and
// outlives the worker until its lease runs out. The worker keeps the port
// bound, so the kernel still referees, and renews the lease while it
// lives.
type leased struct {
	r      store.Reservation
	holder string
	ttl    time.Duration
	since  int64 // monotonic: when the call that last granted or renewed the lease began
	sock   io.Closer
	done   int64 // monotonic: when the worker means to release or drop it
}

// leaseSteps renews the worker's leases that are due, ends those whose
// time is up (seven in ten it releases with Allocator.ReleaseHolder; the others it
// drops: closes the socket and stops renewing, so that they run out), and
// now and then takes a new one, by Allocate or Reserve with Request.Holder.
func (w *worker) leaseSteps(ctx context.Context) {
	w.renewDue(ctx)
	now := monotonic()
	for _, l := range w.leases {
		if now < l.done {
			continue
		}
		if w.rng.IntN(10) < 7 {
			w.endLease(l, KindRelease, "")
			w.giveBackLease(ctx, l)
		} else {
			w.endLease(l, KindLeaseDrop, "")
		}
	}
	if n := w.rng.IntN(100); n < 10 && len(w.leases) < maxLeases {
		w.takeLease(ctx, n < 3)
	}
}

// takeLease asks for a lease on a port for a new holder, logs the grant
// with the time the call began, and binds the port at once. Its TTL is 2
// to 3 s, so that the leases of killed workers run out while the run goes
// on.
func (w *worker) takeLease(ctx context.Context, static bool) {
	req := w.request()
	w.nlease++
	req.Holder, req.TTL = fmt.Sprintf("%s/lease-%d", w.proc, w.nlease), 2*time.Second+time.Duration(w.rng.IntN(1000))*time.Millisecond
	since := monotonic()
	r, err := w.ask(ctx, req, static, "-lease")
	switch {
	case err == nil:
	case errors.Is(err, store.ErrExhausted):
		w.log.add(Event{Kind: KindExhausted, Holder: req.Holder, DurNS: monotonic() - since})
		return
	case errors.Is(err, store.ErrHeld), ctx.Err() != nil, timedOut(err), passing(err):
		// A call that gave up may have left a lease in the store: it runs
		// out within its TTL, and the worker claims nothing meanwhile.
		return
	default:
		w.log.add(Event{Kind: KindError, Err: unexpected(err)})
		return
	}
	w.log.add(Event{Kind: KindGrant, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, Static: static,
		Holder: req.Holder, TTLNS: int64(req.TTL), Since: since, DurNS: monotonic() - since})
	// Held for 0.2-6 s: some past several renewals.
	h := &leased{r: r, holder: req.Holder, ttl: req.TTL, since: since,
		done: monotonic() + int64(200*time.Millisecond+time.Duration(w.rng.IntN(5800))*time.Millisecond)}
	if monotonic()-since > int64(req.TTL)/2 {
		// The call took so long that the lease may end before the worker
		// could renew it: give it back unbound.
		w.log.add(Event{Kind: KindRelease, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, Holder: req.Holder})
		w.giveBackLease(ctx, h)
		return
	}
	sock, ok := w.bindGrant(ctx, r, req.Holder)
	if !ok {
		w.giveBackLease(ctx, h)
		return
	}
	h.sock = sock
	w.leases[req.Holder] = h
}

// renewDue renews every lease a third of whose TTL has passed since it
// was granted or last renewed. A lease that has ended (Renew finds
// nothing: the worker was frozen, or its calls slow, past its TTL; or the
// store was lost) is let go: its socket closed, its end logged.
func (w *worker) renewDue(ctx context.Context) {
	for _, l := range w.leases {
		since := monotonic()
		if since-l.since < int64(l.ttl)/3 {
			continue
		}
		var n int
		err := w.call(ctx, "renew", func(ctx context.Context) (err error) {
			n, err = w.a.Renew(ctx, l.holder, l.ttl)
			return err
		})
		switch {
		case err == nil && n == 1:
			l.since = since
			w.log.add(Event{Kind: KindRenew, Proto: string(l.r.Protocol), Addr: l.r.Addr.String(), Port: l.r.Port,
				Holder: l.holder, TTLNS: int64(l.ttl), Since: since})
		case err == nil:
			w.log.add(Event{Kind: KindError, Err: fmt.Sprintf("renew %q: %d reservations renewed; want 1", l.holder, n)})
		case errors.Is(err, store.ErrNotFound):
			w.endLease(l, KindLeaseEnded, err.Error())
		case ctx.Err() != nil, timedOut(err), passing(err):
			// Counted with the call; the next step tries again.
		default:
			w.log.add(Event{Kind: KindError, Err: "renew: " + unexpected(err)})
		}
	}
}

// giveBackLease releases a lease whose claim the log has ended. A lease
// that has ended already, or that a release that failed leaves, runs out
// by itself within its TTL.
func (w *worker) giveBackLease(ctx context.Context, l *leased) {
	err := w.call(context.WithoutCancel(ctx), "release-lease", func(ctx context.Context) error {
		_, err := w.a.ReleaseHolder(ctx, l.holder, store.Filter{})
		return err
	})
	switch {
	case err == nil, errors.Is(err, store.ErrNotFound), timedOut(err), passing(err):
	default:
		w.log.add(Event{Kind: KindError, Err: "release lease: " + unexpected(err)})
	}
}

// passing reports whether err of a lease call is counted with the call,
// not an error: a shortage (ErrTransient), or a store whose file was lost
// under the call (-lose-store), which a lease call does not go on past.
func passing(err error) bool {
	return errors.Is(err, store.ErrTransient) || errors.Is(err, store.ErrLost)
}

// endLease closes the lease's socket, forgets it and logs an event of
// kind about it: its release (which giveBackLease then makes), its drop
// (as a holder that went away: the lease holds the port until it runs
// out), or its end found by a renewal (msg says so).
func (w *worker) endLease(l *leased, kind, msg string) {
	_ = l.sock.Close()
	delete(w.leases, l.holder)
	w.log.add(Event{Kind: kind, Proto: string(l.r.Protocol), Addr: l.r.Addr.String(), Port: l.r.Port, Holder: l.holder, Err: msg})
}
