// Package seam is the one door through which portalloc's concept packages
// (pool, portset, fleet, lease, statedir, expvarmetrics) reach what an
// Allocator does not export: the holds a set or a pool takes of a row
// under its own name, the candidate ports of its range, and its store.
//
// Package portalloc fills in a Core once, in an init function, with its
// own unexported methods; a concept package reads it with Get, giving the
// same type arguments: A is *portalloc.Allocator, R portalloc.Reservation,
// Q portalloc.Request and C portalloc.Config (seam cannot name them:
// portalloc imports it). Being internal to portalloc, it is no API: users
// see only the concept packages' functions.
//
// The door stays small on purpose: a concept that needs more of the
// Allocator than this belongs in portalloc.
package seam

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/store"
)

// Core is what an Allocator a lends its concept packages: the holds of
// sets and pools (package portset, pool) first, then what package fleet,
// expvarmetrics, lease and statedir each need. via names the
// holder of a hold for the process-wide count of holds of a row and for
// messages (`pool "web"`, `set "dev"`; "" is the Allocator's own); see
// portalloc's refs.go.
type Core[A, R, Q, C any] struct {
	// Allocate takes a free port of within (the Allocator's candidates, or
	// a narrower set of them) for req, held by via, counted in Stats as an
	// Allocate.
	Allocate func(ctx context.Context, a A, req Q, within *portrange.Set, via string) (R, error)
	// Obtain reserves port for req, or allocates one of the range when
	// port is 0, held by via, counted in Stats as a Reserve or an Allocate.
	Obtain func(ctx context.Context, a A, req Q, port uint16, via string) (R, error)
	// Adopt takes a hold, by via, of r: a row this process already has in
	// the store.
	Adopt func(ctx context.Context, a A, r R, via string) (R, error)
	// OwnRows returns this process's reservations whose label starts with
	// prefix, by label, and reports for a reservation whether its row was
	// in the store before (true when that could not be read).
	OwnRows func(ctx context.Context, a A, prefix string) (map[string]R, func(R) bool, error)
	// Release drops one hold of r by via; with keepRow it never deletes
	// the row. It waits at most until ctx is done (see ReleaseContext).
	Release func(ctx context.Context, a A, r R, via string, keepRow bool) error
	// ReleaseContext is the context of a release: ctx's values without its
	// cancellation, bounded by Config.Timeout.
	ReleaseContext func(ctx context.Context, a A) (context.Context, context.CancelFunc)
	// Transfer hands r, held by via, to the running process pid.
	Transfer func(ctx context.Context, a A, r R, pid int, via string) error
	// ReapHanded releases the rows via handed to processes that have
	// exited since, and keeps the others.
	ReapHanded func(ctx context.Context, a A, via string) error
	// Normalize validates req and fills in its zero fields, as Allocate
	// does.
	Normalize func(a A, req Q) (Q, error)
	// Candidates is the set of ports Allocate walks: the range less the
	// exclusions and the OS ephemeral range, split into segments.
	Candidates func(a A) *portrange.Set
	// Closed reports whether Close has been called.
	Closed func(a A) bool
	// Claim reserves name among the Allocator's attachments (its pools),
	// and reports whether it was closed or name was taken already.
	Claim func(a A, name string) (closed, taken bool)
	// Attach gives a claimed name the function that the Allocator's Close
	// calls first, with Close's deadline; it reports false when the
	// Allocator has been closed meanwhile.
	Attach func(a A, name string, close func(context.Context) error) bool
	// Detach frees a claimed or attached name.
	Detach func(a A, name string)
	// OnFleet runs call on the Allocator's fleet store (a store.FleetStore)
	// within Config.Timeout and puts its error in portalloc's words,
	// without the prefix: a closed Allocator is ErrClosed, a store's
	// failure wraps ErrStoreUnavailable and a row that is not there
	// ErrNotHeld. Without a fleet's store it fails with a *FieldError for
	// Config.StoreDSN.
	OnFleet func(ctx context.Context, a A, call func(context.Context, store.FleetStore) error) error
	// Usage returns how many ports Allocate may hand out, and how many of
	// them have a reservation in the store (package expvarmetrics).
	Usage func(ctx context.Context, a A) (ports, reserved int, err error)
	// AllocateLease, ReserveLease, Renew and ReleaseHolder are package
	// lease's Allocate, Reserve, Renew and Release; their errors wrap
	// ErrHolderNotFound where the holder holds nothing to act on.
	AllocateLease     func(ctx context.Context, a A, req Q, l store.Lease) (R, error)
	ReserveLease      func(ctx context.Context, a A, req Q, port uint16, l store.Lease) (R, error)
	Renew             func(ctx context.Context, a A, holder string, ttl time.Duration) (int, error)
	ReleaseHolder     func(ctx context.Context, a A, holder string, f store.Filter) (int, error)
	ErrHolderNotFound error
	// NewWithOpener is portalloc.New for a program that can open the
	// store a Config.StoreDSN names, and OpenStoreWith is fleet.OpenStore:
	// open opens it, as a tool's when tool is true (no background sweep).
	// Package fleet hands them its PostgreSQL store.
	NewWithOpener func(ctx context.Context, cfg C, open func(ctx context.Context, cfg C, tool bool) (store.Store, error)) (A, error)
	OpenStoreWith func(ctx context.Context, cfg C, open func(ctx context.Context, cfg C, tool bool) (store.Store, error)) (store.Store, error)
	// DefaultStateDir, DefaultStateDirReason and TakeOverDefaultStateDir
	// are package statedir's Default, DefaultReason and TakeOver.
	DefaultStateDir         func() (string, error)
	DefaultStateDirReason   func() (dir, reason string, err error)
	TakeOverDefaultStateDir func(ctx context.Context, log logr.Logger) (string, error)
}

// The files an Allocator keeps in its state directory.
const (
	DatabaseFile = "berth.db" // the SQLite state store
	MRUFile      = "mru.json" // the MRU fallback's record
)

var core any

// Set makes c the Core that Get returns; portalloc calls it once, at init.
func Set[A, R, Q, C any](c Core[A, R, Q, C]) { core = c }

// Get returns the Core portalloc set, for package-level variables of the
// concept packages (which portalloc's init precedes).
func Get[A, R, Q, C any]() Core[A, R, Q, C] { return core.(Core[A, R, Q, C]) }
