//go:build unix && !darwin && !ios

package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/statestore"
)

func init() {
	// opendefault opens an Allocator on the default state directory (with
	// BERTH_TEST_GO set, once a byte arrives on stdin) and says "moved"
	// when it took over the store of the previous default, "found" when
	// it did not, or "error: ..."; it holds the Allocator until stdin
	// closes.
	workers["opendefault"] = func(ctx context.Context) error {
		if os.Getenv("BERTH_TEST_GO") != "" {
			_, _ = os.Stdin.Read(make([]byte, 1))
		}
		var (
			mu    sync.Mutex
			moved bool
		)
		log := funcr.New(func(_, args string) {
			mu.Lock()
			defer mu.Unlock()
			moved = moved || strings.Contains(args, "moved the state store")
		}, funcr.Options{})
		a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, Logger: log})
		if err != nil {
			return err
		}
		defer a.Close()
		mu.Lock()
		if moved {
			fmt.Println("moved")
		} else {
			fmt.Println("found")
		}
		mu.Unlock()
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	}
}

// freshHome points HOME at a new directory of the test's, with
// XDG_STATE_HOME, XDG_CACHE_HOME and BERTH_STATE_DIR unset (empty), and
// returns it. Workers started later inherit it.
func freshHome(tb testing.TB) string {
	tb.Helper()
	home := tb.TempDir()
	tb.Setenv("HOME", home)
	tb.Setenv("XDG_STATE_HOME", "")
	tb.Setenv("XDG_CACHE_HOME", "")
	tb.Setenv(portalloc.EnvStateDir, "")
	return home
}

// TestDefaultStateDirLinux: the default is $XDG_STATE_HOME/berth when the
// variable is an absolute path, else ~/.local/state/berth; the reason says
// which, and that it is state, not cache. Without a home there is none,
// and the error names BERTH_STATE_DIR.
func TestDefaultStateDirLinux(t *testing.T) {
	home := freshHome(t)
	xdg := t.TempDir()
	for _, tc := range []struct {
		home, xdg  string
		want, why  string // why: a part of the reason
		wantErrHas string
	}{
		{home: home, want: filepath.Join(home, ".local", "state", "berth"), why: "the default: $XDG_STATE_HOME unset, so ~/.local/state/berth"},
		{home: home, xdg: xdg, want: filepath.Join(xdg, "berth"), why: "the default: $XDG_STATE_HOME/berth"},
		{home: "", xdg: xdg, want: filepath.Join(xdg, "berth"), why: "the default: $XDG_STATE_HOME/berth"},
		{home: home, xdg: "relative/state", want: filepath.Join(home, ".local", "state", "berth"), why: `$XDG_STATE_HOME "relative/state" is relative, which the XDG base directory spec says to ignore`},
		{home: "", wantErrHas: "$HOME is not set"},
		{home: "some/where", wantErrHas: `$HOME "some/where" is not an absolute path`},
	} {
		t.Setenv("HOME", tc.home)
		t.Setenv("XDG_STATE_HOME", tc.xdg)
		dir, why, err := statedir.DefaultReason()
		got, gerr := statedir.Default()
		if got != dir || (gerr == nil) != (err == nil) {
			t.Errorf("HOME=%q XDG_STATE_HOME=%q: DefaultStateDir() = %q, %v; DefaultStateDirReason says %q, %v", tc.home, tc.xdg, got, gerr, dir, err)
		}
		if tc.wantErrHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrHas) || !strings.Contains(err.Error(), portalloc.EnvStateDir) {
				t.Errorf("HOME=%q XDG_STATE_HOME=%q: DefaultStateDirReason() = %q, %v; want an error saying %q and naming %s", tc.home, tc.xdg, dir, err, tc.wantErrHas, portalloc.EnvStateDir)
			}
			continue
		}
		if err != nil || dir != tc.want || !strings.Contains(why, tc.why) || !strings.Contains(why, "state, not cache") {
			t.Errorf("HOME=%q XDG_STATE_HOME=%q: DefaultStateDirReason() = %q, %q, %v; want %q, a reason saying %q and state, not cache", tc.home, tc.xdg, dir, why, err, tc.want, tc.why)
		}
	}
}

// TestTakeOverWithLiveHolder: a process of an earlier berth (its default
// was the cache directory) holds a port there, and the store remembers a
// sticky port and has an MRU file. A second process opening the default
// moves the store; a third finds the port still reserved by the first
// process, gets the sticky port back, and the old directory keeps a note.
func TestTakeOverWithLiveHolder(t *testing.T) {
	ctx := context.Background()
	home := freshHome(t)
	oldDir := filepath.Join(home, ".cache", "berth")
	newDir := filepath.Join(home, ".local", "state", "berth")

	port := freeRun(t, 1)
	holder := holdInWorker(t, oldDir, lo4, port)
	a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: oldDir, Range: allocRange})
	if err != nil {
		t.Fatal(err)
	}
	sticky, err := a.Allocate(ctx, portalloc.Request{Label: "api", Sticky: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // releases the port; the store remembers it
		t.Fatal(err)
	}
	m, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeMRU, StateDir: oldDir, Range: allocRange})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(ctx, portalloc.Request{}); err != nil {
		t.Fatal(err)
	}
	_ = m.Close()
	mruBefore, err := os.ReadFile(filepath.Join(oldDir, statedir.MRUFile))
	if err != nil {
		t.Fatal(err)
	}

	// An Allocator of this berth told to use the old directory, open
	// across the move.
	c, err := portalloc.New(ctx, portalloc.Config{StateDir: oldDir, Range: allocRange, Logger: funcr.New(func(string, string) {}, funcr.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	taker := spawn(t, "opendefault")
	if line := readLine(t, taker); line != "moved" {
		t.Fatalf("the process opening the default said %q; want moved", line)
	}

	b, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, Range: allocRange})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := b.Config().StateDir; got != newDir {
		t.Errorf("StateDir = %s; want %s", got, newDir)
	}
	_, err = b.Reserve(ctx, portalloc.Request{Addr: lo4}, port)
	var ce *portalloc.ConflictError
	pid := holder.cmd.Process.Pid
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != pid || !strings.Contains(err.Error(), "held by pid "+strconv.Itoa(pid)) {
		t.Errorf("Reserve(127.0.0.1:%d) after the take-over = %v; want a conflict naming the holder, pid %d", port, err, pid)
	}
	if r, err := b.Allocate(ctx, portalloc.Request{Label: "api", Sticky: true}); err != nil || r.Port != sticky.Port {
		t.Errorf("sticky Allocate(api) after the take-over = %v, %v; want port %d again", r, err, sticky.Port)
	}
	if got, err := os.ReadFile(filepath.Join(newDir, statedir.MRUFile)); err != nil || string(got) != string(mruBefore) {
		t.Errorf("MRU file in %s = %q, %v; want the old one, %q", newDir, got, err, mruBefore)
	}
	note, ok, err := statestore.ReadMoved(filepath.Join(oldDir, statedir.DatabaseFile))
	if err != nil || !ok || note.To != filepath.Join(newDir, statedir.DatabaseFile) {
		t.Errorf("note in %s = %+v, %v, %v; want one naming %s", oldDir, note, ok, err, newDir)
	}
	if _, why, err := statedir.DefaultReason(); err != nil || !strings.Contains(why, "taken over from "+oldDir+" on ") {
		t.Errorf("DefaultStateDirReason() = %q, %v; want it to say the store was taken over from %s", why, err, oldDir)
	}
	// The Allocator open on the old directory across the move can no
	// longer write there; it falls back to its MRU file, which still
	// keeps clear of the ports the moved store holds.
	_, err = c.Reserve(ctx, portalloc.Request{Addr: lo4}, port)
	if !errors.Is(err, portalloc.ErrPortHeld) {
		t.Errorf("Reserve(127.0.0.1:%d) by an Allocator on the old directory after the move = %v; want ErrPortHeld", port, err)
	}
	if cause := c.FallbackCause(); !errors.Is(cause, statestore.ErrMoved) || !strings.Contains(cause.Error(), newDir) {
		t.Errorf("FallbackCause() of the Allocator on the old directory = %v; want ErrMoved naming %s", cause, newDir)
	}
	// The old directory, named explicitly, is refused with the way to
	// the new one, in the fallback mode too.
	if _, err := portalloc.New(ctx, portalloc.Config{StateDir: oldDir}); !errors.Is(err, statestore.ErrMoved) || !errors.Is(err, portalloc.ErrStoreUnavailable) || !strings.Contains(err.Error(), newDir) {
		t.Errorf("New(StateDir: %s) after the take-over = %v; want ErrMoved naming %s", oldDir, err, newDir)
	}
}

// TestTakeOverSixAtOnce: six processes open the default at once while a
// store waits at the old one: exactly one moves it, none fails.
func TestTakeOverSixAtOnce(t *testing.T) {
	home := freshHome(t)
	oldDir := filepath.Join(home, ".cache", "berth")
	port := freeRun(t, 1)
	holder := holdInWorker(t, oldDir, lo4, port)

	var procs []*proc
	for range 6 {
		procs = append(procs, spawn(t, "opendefault", "BERTH_TEST_GO=1"))
	}
	for _, p := range procs {
		if _, err := p.stdin.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	said := map[string]int{}
	for _, p := range procs {
		said[readLine(t, p)]++
	}
	if said["moved"] != 1 || said["found"] != 5 {
		t.Errorf("six processes opening the default said %v; want moved once and found five times", said)
	}
	b, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, Range: allocRange})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var ce *portalloc.ConflictError
	if _, err := b.Reserve(context.Background(), portalloc.Request{Addr: lo4}, port); !errors.As(err, &ce) || ce.Holder.Owner.PID != holder.cmd.Process.Pid {
		t.Errorf("Reserve(127.0.0.1:%d) after six took over = %v; want a conflict with pid %d", port, err, holder.cmd.Process.Pid)
	}
}

// TestTakeOverRefusesUnsafeOldDir: an old default that others may write is
// refused with ErrUnsafe: nothing moves, no store is made at the new
// default, and the error says what to fix. (One that another user owns:
// TestTakeOverRefusesForeignOldDir, which must pretend not to be root.)
func TestTakeOverRefusesUnsafeOldDir(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, dir string)
		says  string
	}{
		{"world-writable", func(t *testing.T, dir string) {
			t.Helper()
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
		}, "chmod go-w"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			home := freshHome(t)
			oldDir := filepath.Join(home, ".cache", "berth")
			newDir := filepath.Join(home, ".local", "state", "berth")
			a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: oldDir, Range: allocRange})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Allocate(ctx, portalloc.Request{Label: "kept"}); err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			tc.spoil(t, oldDir)
			for _, mode := range []portalloc.Mode{portalloc.ModeStateStoreWithFallback, portalloc.ModeStateStore} {
				b, err := portalloc.New(ctx, portalloc.Config{Mode: mode, Range: allocRange})
				if err == nil {
					_ = b.Close()
				}
				if !errors.Is(err, portalloc.ErrUnsafe) || !errors.Is(err, portalloc.ErrStoreUnavailable) ||
					!strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "nothing was moved") {
					t.Errorf("New(%s) with the old default %s = %v; want ErrUnsafe saying %q and that nothing was moved", mode, tc.name, err, tc.says)
				}
			}
			if _, err := os.Stat(filepath.Join(newDir, statedir.DatabaseFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a store was made at the new default after a refused take-over (%v)", err)
			}
			if _, ok, _ := statestore.ReadMoved(filepath.Join(oldDir, statedir.DatabaseFile)); ok {
				t.Errorf("a refused take-over left a note in %s", oldDir)
			}
			if err := os.Chown(oldDir, os.Geteuid(), os.Getegid()); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(oldDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if held := a.Held(); len(held) != 1 {
				t.Errorf("the old store's Allocator holds %v; want its one port", held)
			}
			if _, err := a.Allocate(ctx, portalloc.Request{}); err != nil {
				t.Errorf("Allocate in the old store after a refused take-over = %v; want it still working", err)
			}
		})
	}
}

// TestExplicitStateDirTakesNothingOver: a StateDir given explicitly, even
// the default's own directory, is used as it is: the store at the old
// default stays there.
func TestExplicitStateDirTakesNothingOver(t *testing.T) {
	ctx := context.Background()
	home := freshHome(t)
	oldDir := filepath.Join(home, ".cache", "berth")
	newDir := filepath.Join(home, ".local", "state", "berth")
	a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: oldDir, Range: allocRange})
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: newDir, Range: allocRange})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok, _ := statestore.ReadMoved(filepath.Join(oldDir, statedir.DatabaseFile)); ok {
		t.Errorf("an explicit StateDir took over the store at %s", oldDir)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{Addr: r.Addr}, r.Port); err != nil {
		t.Errorf("the old store's own Reserve of its port = %v; want it still served there", err)
	}
}
