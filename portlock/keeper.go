package portlock

import (
	"errors"
	"net/netip"
	"strconv"
	"time"
)

// Keeper is the process that holds the locks of one owner that runs no
// berth code of its own: a process (the shell that ran berth get, a child
// handed a port) or a named holder under a lease (a CI job). It holds the
// locks it is handed until its owner exits (a process keeper) or their
// lease ends (a holder keeper), or until they are dropped, and then exits:
// one keeper per owner, not per port, started on the first Hold.
//
// A keeper is the program that asks for it, started again in the
// background: os.Executable run with the variable BERTH_PORTLOCK_KEEPER,
// which package portlock reads when it is initialised, before main and
// before any test, and then becomes the keeper instead of the program. It
// takes no input but its own socket, writes nothing, leaves the session of
// the program that started it (a Ctrl-C in the terminal does not reach it),
// and answers only processes of its own user (and root).
//
// A keeper killed takes its locks with it: what the owner's reservations
// keep then is their record (a row of a store), which berth processes that
// use that store still honour. Keepers exist on Linux only; elsewhere Hold
// returns ErrNoKeeper and a caller keeps its own locks while it runs.
//
// The zero Keeper names no owner. A Keeper is a value, safe for concurrent
// use: each call speaks to the keeper afresh.
type Keeper struct {
	pid    int
	start  uint64 // the owner's start, as /proc/PID/stat's field 22 reads
	holder string
}

// ErrNoKeeper is returned when there is no keeper to ask (Drop, Renew) or
// none can run on this system (Hold).
var ErrNoKeeper = errors.New("no keeper")

// ProcessKeeper returns the keeper of the running process pid. The keeper
// knows the process by its pid and its start, so a pid the kernel reuses
// later names another keeper.
func ProcessKeeper(pid int) (Keeper, error) {
	start, err := startOf(pid)
	if err != nil {
		return Keeper{}, err
	}
	return Keeper{pid: pid, start: start}, nil
}

// HolderKeeper returns the keeper of the named holder, whose locks each
// last for the lease they were handed with (Hold) or renewed with (Renew).
func HolderKeeper(holder string) Keeper { return Keeper{holder: holder} }

func (k Keeper) String() string {
	if k.holder != "" {
		return "the keeper of holder " + strconv.Quote(k.holder)
	}
	return "the keeper of pid " + strconv.Itoa(k.pid)
}

// Hold hands the keeper copies of locks, starting it when it does not run,
// and returns once it holds them all; the caller then closes its own. For
// a holder's keeper, ttl is how long from now it keeps each of them (a lock
// it holds already starts its lease over); a process's keeper keeps them
// until the process exits, and ignores ttl.
func (k Keeper) Hold(ttl time.Duration, locks ...*Lock) error { return k.hold(ttl, locks) }

// Drop asks the keeper to let go of the lock of network addr:port, and
// reports whether it held it. With no keeper running it reports false.
func (k Keeper) Drop(network string, addr netip.Addr, port uint16) (bool, error) {
	addr, err := check(network, addr, port)
	if err != nil {
		return false, err
	}
	return k.drop(key(network, addr, port))
}

// Take asks the keeper for its lock of network addr:port: the keeper lets
// go of it and the caller gets it, never free in between, to hand to
// another keeper (an owner's ports given to another process) or to hold
// itself. It returns nil and no error when the keeper does not hold it or
// none runs.
func (k Keeper) Take(network string, addr netip.Addr, port uint16) (*Lock, error) {
	addr, err := check(network, addr, port)
	if err != nil {
		return nil, err
	}
	hs, err := k.take(key(network, addr, port))
	if err != nil || hs == nil {
		return nil, err
	}
	return &Lock{network: network, addr: addr, port: port, hs: hs}, nil
}

// Renew starts the lease of every lock the keeper holds over, at ttl from
// now, and returns how many it holds: an error wrapping ErrNoKeeper when
// none runs.
func (k Keeper) Renew(ttl time.Duration) (int, error) { return k.renew(ttl) }

// key is how a keeper knows the lock of network addr:port: its name after
// the prefix (tcp/24989/127.0.0.1).
func key(network string, addr netip.Addr, port uint16) string {
	return network + "/" + strconv.Itoa(int(port)) + "/" + addrTag(addr)
}

// addrTag is an address in a lock's name: its own, "*" for both wildcards.
func addrTag(a netip.Addr) string {
	if a.IsUnspecified() {
		return "*"
	}
	return a.String()
}
