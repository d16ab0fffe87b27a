// Package statedir says where berth keeps its state store by default,
// and why there: the platform's directory for application state, never a
// cache directory that cleaners empty while the processes whose ports it
// records still run (see portalloc.Config.StateDir). It names the files
// in it, and moves a store left at the previous default,
// os.UserCacheDir()/berth, into the new one.
//
// portalloc.New uses the same rules when Config.StateDir is empty; this
// package is for programs that show or fill in the directory themselves,
// as the berth command does.
package statedir

import (
	"context"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/seam"
)

// core is portalloc's, which applies the same rules to an empty
// Config.StateDir.
var core = seam.Get[*portalloc.Allocator, portalloc.Reservation, portalloc.Request, portalloc.Config]()

// The files an Allocator keeps in its state directory.
const (
	DatabaseFile = seam.DatabaseFile // the SQLite state store
	MRUFile      = seam.MRUFile      // the MRU fallback's record
)

// Default returns the state directory used when portalloc.Config.StateDir is
// empty: on Linux and the other Unix systems but macOS $XDG_STATE_HOME/berth,
// or ~/.local/state/berth when XDG_STATE_HOME is unset or relative; on macOS
// ~/Library/Application Support/berth; on Windows %LocalAppData%\berth.
// For root when that lies in another user's home it is root's own (see
// portalloc.Config.StateDir). It only names the directory: portalloc.New and fleet.OpenStore, and
// TakeOver, first take over a store left at the previous
// default, os.UserCacheDir()/berth.
func Default() (string, error) { return core.DefaultStateDir() }

// DefaultReason returns Default and, for people to read, why
// it is that directory: the rule or variable that chose it, that it holds
// state, not cache, and, once berth has taken over the store of the
// previous default, from where and when. For example
//
//	the default: $XDG_STATE_HOME unset, so ~/.local/state/berth; state, not cache, so cache cleaners leave it; taken over from /home/u/.cache/berth on 2026-11-26 12:53:41 UTC
func DefaultReason() (dir, reason string, err error) { return core.DefaultStateDirReason() }

// TakeOver returns Default after moving into it the
// state store of the previous default, os.UserCacheDir()/berth (root's own
// ~root/.cache/berth under the rule of portalloc.Config.StateDir), when the new
// directory has no store yet and the old one has: a cache directory is
// deleted by cleaners while the programs whose ports it records still run.
// portalloc.New and fleet.OpenStore do the same when portalloc.Config.StateDir is empty; a program
// that fills in portalloc.Config.StateDir with the default itself (as the berth
// command does, to show it) calls this instead of Default.
//
// The store moves with its reservations, sticky ports and MRU file, under
// its own locks, so no reservation is lost and no port is granted twice
// meanwhile, and however many processes take over at once the store moves
// once (see statestore.TakeOver). The old directory keeps a note saying
// where the store went. Waits for the stores' locks end when ctx is done.
//
// When the move fails, nothing has moved and the error says why: an error
// wrapping portalloc.ErrUnsafe when the old directory is not safe to read (another
// user's, or writable by others), one wrapping statestore.ErrBusy when its
// lock is held too long, and so on. berth then refuses rather than open an
// empty store beside the one holding the reservations: fix the cause, or
// set BERTH_STATE_DIR to the old directory to keep using it there.
func TakeOver(ctx context.Context, log logr.Logger) (string, error) {
	return core.TakeOverDefaultStateDir(ctx, log)
}
