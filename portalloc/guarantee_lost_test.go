//go:build linux

package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// The guarantee against a lost store: a store's file removed, replaced or
// truncated under the holders of every kind of owner, with intruders of
// every kind asking for the held port meanwhile and afterwards: none is
// ever granted it, because each owner's lock outlives the record.

// Owner kinds: who holds the port while the store is lost.
const (
	ownLibrary = "library" // a running program's Allocator
	ownExec    = "exec"    // berth run: the program exec'd with the locks
	ownChild   = "child"   // a child handed the port with Files and Transfer
	ownShell   = "shell"   // a process running no berth code: its keeper holds the lock
	ownHolder  = "holder"  // a named holder under a lease: its keeper holds the lock
	ownLock    = "lock"    // a lock without a row, as porttest takes one
)

func init() {
	// own makes BERTH_TEST_OWNER the owner of tcp BERTH_TEST_ADDR:PORT
	// in BERTH_STATE_DIR and prints "ready PID", PID the process that
	// owns it (for a holder, 0). The library and lock owners hold it
	// until stdin closes; exec becomes sleep(1) holding it; the others
	// leave it to their owner and exit.
	workers["own"] = func(ctx context.Context) error {
		kind := os.Getenv("BERTH_TEST_OWNER")
		port, _ := strconv.Atoi(os.Getenv("BERTH_TEST_PORT"))
		addr := netip.MustParseAddr(os.Getenv("BERTH_TEST_ADDR"))
		if kind == ownLock {
			lk, err := portlock.Take("tcp", addr, uint16(port))
			if err != nil {
				return err
			}
			defer func() { _ = lk.Close() }()
			fmt.Println("ready", os.Getpid())
			_, _ = io.Copy(io.Discard, os.Stdin)
			return nil
		}
		a, err := portalloc.New(ctx, workerConfig())
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		req := portalloc.Request{Addr: addr, Label: "owner." + kind}
		if kind == ownHolder {
			req.Holder, req.TTL = os.Getenv("BERTH_TEST_HOLDER"), time.Minute
		}
		r, err := a.Reserve(ctx, req, uint16(port))
		if err != nil {
			return err
		}
		switch kind {
		case ownLibrary:
			fmt.Println("ready", os.Getpid())
			_, _ = io.Copy(io.Discard, os.Stdin)
			return nil
		case ownHolder:
			fmt.Println("ready 0")
			return nil
		case ownExec:
			// As berth run does: the lock's descriptors pass through exec,
			// the row becomes this process's own.
			fs, err := a.Files(r)
			if err != nil {
				return err
			}
			for _, f := range fs {
				if _, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD, 64); err != nil {
					return err
				}
				_ = f.Close()
			}
			if err := a.Transfer(ctx, r, os.Getpid()); err != nil {
				return err
			}
			if err := a.Close(); err != nil {
				return err
			}
			fmt.Println("ready", os.Getpid())
			sleep, err := exec.LookPath("sleep")
			if err != nil {
				return err
			}
			return syscall.Exec(sleep, []string{"sleep", "120"}, os.Environ())
		}
		// child and shell: a process of its own, which outlives this one.
		cmd := exec.Command("sleep", "120")
		if kind == ownChild {
			fs, err := a.Files(r)
			if err != nil {
				return err
			}
			cmd.ExtraFiles = fs
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		for _, f := range cmd.ExtraFiles {
			_ = f.Close()
		}
		if err := a.Transfer(ctx, r, cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			return err
		}
		fmt.Println("ready", cmd.Process.Pid)
		return nil
	}
}

// owner is a live owner of a port, as the "own" worker made it.
type owner struct {
	kind   string
	worker *proc
	pid    int
	holder string
}

// makeOwner makes an owner of kind hold tcp addr:port in dir.
func makeOwner(t *testing.T, dir, kind string, addr netip.Addr, port uint16) *owner {
	t.Helper()
	o := &owner{kind: kind}
	if kind == ownHolder {
		o.holder = fmt.Sprintf("test/%s/%d", t.Name(), time.Now().UnixNano())
	}
	o.worker = spawn(t, "own", "BERTH_STATE_DIR="+dir, "BERTH_TEST_OWNER="+kind, "BERTH_TEST_HOLDER="+o.holder,
		"BERTH_TEST_ADDR="+addr.String(), "BERTH_TEST_PORT="+strconv.Itoa(int(port)))
	line := readLine(t, o.worker)
	pid, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		t.Fatalf("owner %s: %s", kind, line)
	}
	o.pid, _ = strconv.Atoi(pid)
	if kind == ownChild || kind == ownShell || kind == ownHolder {
		_ = o.worker.cmd.Wait() // it left the port to its owner
	}
	t.Cleanup(func() { o.end(t, dir) })
	return o
}

// end ends the owner: its process is killed, a holder's reservations
// released.
func (o *owner) end(t *testing.T, dir string) {
	t.Helper()
	switch o.kind {
	case ownHolder:
		if o.holder == "" {
			return
		}
		a, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange, IgnoreEnv: true})
		if err != nil {
			t.Errorf("end holder %q: %v", o.holder, err)
			return
		}
		defer func() { _ = a.Close() }()
		if _, err := a.ReleaseHolder(context.Background(), o.holder, store.Filter{}); err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Errorf("end holder %q: %v", o.holder, err)
		}
		// The row may be gone with the store while the keeper still
		// holds the lock: drop it there too.
		if _, err := portlock.HolderKeeper(o.holder).Renew(store.MinTTL); err != nil && !errors.Is(err, portlock.ErrNoKeeper) {
			t.Errorf("end holder %q: %v", o.holder, err)
		}
		o.holder = ""
	case ownLibrary, ownLock:
		_ = o.worker.stdin.Close()
		_ = o.worker.cmd.Wait()
	default:
		if o.pid != 0 {
			_ = syscall.Kill(o.pid, syscall.SIGKILL)
			if o.kind == ownExec {
				_ = o.worker.cmd.Wait()
			}
			o.pid = 0
		}
	}
}

// loseStore does to dir's store what attack says: "removed" (the whole
// directory), "replaced" (a new, valid, empty store renamed over it) or
// "truncated" (to 0 bytes).
func loseStore(t *testing.T, dir, attack string) {
	t.Helper()
	db := filepath.Join(dir, "berth.db")
	switch attack {
	case "removed":
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	case "replaced":
		other := filepath.Join(t.TempDir(), "berth.db")
		s, err := statestore.Open(context.Background(), other, statestore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
		if err := os.Rename(other, db); err != nil {
			t.Fatal(err)
		}
	case "truncated":
		if err := os.Truncate(db, 0); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("attack %q", attack)
	}
}

// intrude asks for tcp addr:port in dir as each kind of intruder does,
// and fails t for any grant. It returns how many asked.
func intrude(t *testing.T, dir string, addr netip.Addr, port uint16, what string) int {
	t.Helper()
	ctx := context.Background()
	cfg := portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: store.Range{First: port, Last: port},
		AllowEphemeralOverlap: true, IgnoreEnv: true}
	a, err := portalloc.New(ctx, cfg)
	if err != nil {
		t.Fatalf("%s: New: %v", what, err)
	}
	defer func() { _ = a.Close() }()
	asked := 0
	refused := func(who string, r store.Reservation, err error) {
		asked++
		if err == nil {
			t.Errorf("%s: %s was granted %v, which its owner holds", what, who, r)
			return
		}
		if !errors.Is(err, store.ErrHeld) && !errors.Is(err, store.ErrExhausted) {
			t.Errorf("%s: %s: %v; want a refusal (ErrHeld, ErrExhausted)", what, who, err)
		}
	}
	for _, ask := range []netip.Addr{addr, any4, any6} {
		r, err := a.Reserve(ctx, portalloc.Request{Addr: ask, Label: "intruder"}, port)
		refused("Reserve("+ask.String()+")", r, err)
		r, err = a.Reserve(ctx, portalloc.Request{Addr: ask, Holder: "intruder", TTL: time.Minute}, port)
		refused("a holder's Reserve("+ask.String()+")", r, err)
		if lk, err := portlock.Take("tcp", ask, port); err == nil {
			_ = lk.Close()
			refused("a lock as porttest takes one on "+ask.String(), store.Reservation{Key: store.Key{Protocol: store.TCP, Addr: ask, Port: port}}, nil)
		} else {
			asked++
		}
	}
	r, err := a.Allocate(ctx, portalloc.Request{Addr: addr, Label: "intruder"})
	refused("Allocate", r, err)
	return asked
}

// TestLostStoreEveryOwner: for each kind of owner and each way of losing
// the store, intruders of every kind ask for the owner's port before the
// loss, right after it and after the store is made anew; none is granted
// it. Once the owner is gone, the port is granted again: the refusals
// were the owner's.
func TestLostStoreEveryOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, kind := range []string{ownLibrary, ownExec, ownChild, ownShell, ownHolder, ownLock} {
		for _, attack := range []string{"removed", "replaced", "truncated"} {
			t.Run(kind+"/"+attack, func(t *testing.T) {
				t.Parallel()
				dir := filepath.Join(t.TempDir(), "state")
				port := freeRun(t, 1)
				o := makeOwner(t, dir, kind, lo4, port)
				intrude(t, dir, lo4, port, "before the loss")
				if kind == ownLock {
					// A lock has no row: the store had nothing of it
					// to lose.
					if err := os.MkdirAll(dir, 0o700); err != nil {
						t.Fatal(err)
					}
				}
				loseStore(t, dir, attack)
				intrude(t, dir, lo4, port, "after the store was "+attack)
				intrude(t, dir, lo4, port, "again")

				o.end(t, dir)
				a := newAllocator(t, portalloc.Config{StateDir: dir, Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
				var r store.Reservation
				var err error
				// A keeper lets go once it sees its owner exit.
				for try := 0; try < 100; try++ {
					if r, err = a.Reserve(context.Background(), portalloc.Request{Addr: lo4}, port); !errors.Is(err, store.ErrHeld) {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				if err != nil {
					t.Fatalf("Reserve(%d) once the %s owner is gone = %v; want it granted", port, kind, err)
				}
				if err := a.Release(context.Background(), r); err != nil {
					t.Error(err)
				}
			})
		}
	}
}
