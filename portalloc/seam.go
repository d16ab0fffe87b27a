package portalloc

import (
	"context"
	"time"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc/internal/seam"
	"github.com/berth-go/berth/store"
)

// The concept packages (pool, portset, fleet, lease, statedir,
// expvarmetrics) reach the Allocator's holds and store through package
// seam, and through nothing else: what they need of it is listed here.
func init() {
	seam.Set(seam.Core[*Allocator, Reservation, Request, Config]{
		Allocate: func(ctx context.Context, a *Allocator, req Request, within *portrange.Set, via string) (Reservation, error) {
			ctx, cancel, req, err := a.begin(ctx, req)
			if err != nil {
				return Reservation{}, err
			}
			defer cancel()
			return a.allocateIn(ctx, req, within, via)
		},
		Obtain: func(ctx context.Context, a *Allocator, req Request, port uint16, via string) (Reservation, error) {
			return a.obtain(ctx, req, port, via)
		},
		Adopt: func(ctx context.Context, a *Allocator, r Reservation, via string) (Reservation, error) {
			return a.adopt(ctx, r, via)
		},
		OwnRows: func(ctx context.Context, a *Allocator, prefix string) (map[string]Reservation, func(Reservation) bool, error) {
			out, before, err := a.ownRows(ctx, prefix)
			if err != nil {
				return nil, nil, err
			}
			// A row was there before when before says so, or when before
			// could not be read.
			return out, func(r Reservation) bool { return before == nil || before[keyOf(r)] }, nil
		},
		Release: func(ctx context.Context, a *Allocator, r Reservation, via string, keepRow bool) error {
			return a.release(ctx, r, via, keepRow)
		},
		ReleaseContext: func(ctx context.Context, a *Allocator) (context.Context, context.CancelFunc) {
			return a.releaseContext(ctx)
		},
		Transfer: func(ctx context.Context, a *Allocator, r Reservation, pid int, via string) error {
			return a.transfer(ctx, r, pid, via)
		},
		ReapHanded: func(ctx context.Context, a *Allocator, via string) error {
			return a.reapHanded(ctx, a.db(), func(h handed) bool { return h.via == via }, false)
		},
		Normalize:  (*Allocator).normalize,
		Candidates: func(a *Allocator) *portrange.Set { return a.set },
		Closed:     (*Allocator).isClosed,
		Claim:      (*Allocator).claim,
		Attach:     (*Allocator).attach,
		Detach:     (*Allocator).detach,
		OnFleet: func(ctx context.Context, a *Allocator, call func(context.Context, store.FleetStore) error) error {
			return a.onFleet(ctx, call)
		},
		AllocateLease: func(ctx context.Context, a *Allocator, req Request, l store.Lease) (Reservation, error) {
			return a.allocateLease(ctx, req, l)
		},
		ReserveLease: func(ctx context.Context, a *Allocator, req Request, port uint16, l store.Lease) (Reservation, error) {
			return a.reserveLease(ctx, req, port, l)
		},
		Renew: func(ctx context.Context, a *Allocator, holder string, ttl time.Duration) (int, error) {
			n, err := a.renew(ctx, holder, ttl)
			return n, opError("renew the leases of holder "+quoteHolder(holder), err)
		},
		ReleaseHolder: func(ctx context.Context, a *Allocator, holder string, f store.Filter) (int, error) {
			ctx, cancel := a.releaseContext(ctx)
			defer cancel()
			n, err := a.releaseHolder(ctx, holder, f)
			return n, opError(releaseHolderOp(holder), err)
		},
		ErrHolderNotFound: errHolderNotFound,
		Usage: func(ctx context.Context, a *Allocator) (int, int, error) {
			return a.usage(ctx)
		},
		NewWithOpener:           newWithOpener,
		DefaultStateDir:         defaultStateDir,
		DefaultStateDirReason:   defaultStateDirReason,
		TakeOverDefaultStateDir: takeOverDefaultStateDir,
		OpenStoreWith:           openStoreWith,
	})
}

// claim reserves name among the Allocator's attachments.
func (a *Allocator) claim(name string) (closed, taken bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.closed:
		return true, false
	case a.attached[name] != nil || a.claimed[name]:
		return false, true
	}
	if a.claimed == nil {
		a.claimed = map[string]bool{}
	}
	a.claimed[name] = true
	return false, false
}

// attach gives the claimed name its close function.
func (a *Allocator) attach(name string, close func(context.Context) error) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	if a.attached == nil {
		a.attached = map[string]func(context.Context) error{}
	}
	a.attached[name] = close
	a.attachOrder = append(a.attachOrder, name)
	return true
}

// detach frees name.
func (a *Allocator) detach(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.claimed, name)
	if a.attached[name] != nil {
		delete(a.attached, name)
		i := 0
		for _, n := range a.attachOrder {
			if n != name {
				a.attachOrder[i] = n
				i++
			}
		}
		a.attachOrder = a.attachOrder[:i]
	}
}

// The files an Allocator keeps in its state directory: package statedir
// exports them.
const (
	databaseFile = seam.DatabaseFile
	mruFile      = seam.MRUFile
)
