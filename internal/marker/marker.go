// Package marker keeps, for each reservation a process holds, a mark that no
// file operation can remove and that vanishes with the process: on Linux a
// socket bound to a name in the abstract unix namespace. A state store that
// has just been created (its directory was deleted, its file replaced or
// truncated) reads the marks of its path before it grants anything, and so
// learns of the live holders whose rows were lost with the old file.
//
// A mark's name carries the store (a hash of its database path), the key and
// the holder's identity:
//
//	berth1/<store>/<protocol>/<address>/<port>/<pid>/<start>/<pid ns>/<time ns>
//
// with the store and the address in unpadded base64url and the numbers in
// base 36, so that the longest name fits the 107 bytes the kernel takes. The
// abstract namespace belongs to the network namespace, like the ports
// themselves; anyone on the host can bind a name in it, so a mark is a
// hint to keep a port, never a reason to hand one out.
//
// Where the OS has no abstract namespace (Supported reports false), Hold
// and Drop do nothing and List finds nothing. The functions are safe for
// concurrent use.
package marker

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// prefix starts every mark's name.
const prefix = "berth1/"

// Mark is one holder's mark of one key.
type Mark struct {
	Protocol string // "tcp" or "udp"
	Addr     netip.Addr
	Port     uint16
	PID      int
	Start    int64  // the holder's start as the kernel records it
	PidNS    uint64 // the holder's pid namespace (its inode; 0 unknown)
	TimeNS   uint64 // the holder's time namespace (its inode; 0 unknown)
}

// Namespace names the marks of the store at path: the first 9 bytes of
// the SHA-256 of the path, in base64url.
func Namespace(path string) string {
	sum := sha256.Sum256([]byte(path))
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

// name is m's socket name in namespace ns, without the leading NUL.
func (m Mark) name(ns string) string {
	b := m.Addr.AsSlice()
	return prefix + ns + "/" + m.Protocol + "/" + base64.RawURLEncoding.EncodeToString(b) + "/" +
		strconv.FormatUint(uint64(m.Port), 36) + "/" + strconv.FormatInt(int64(m.PID), 36) + "/" +
		strconv.FormatInt(m.Start, 36) + "/" + strconv.FormatUint(m.PidNS, 36) + "/" + strconv.FormatUint(m.TimeNS, 36)
}

// parse reads a mark's name in namespace ns; false when it is not one.
func parse(ns, name string) (Mark, bool) {
	rest, ok := strings.CutPrefix(name, prefix+ns+"/")
	if !ok {
		return Mark{}, false
	}
	f := strings.Split(rest, "/")
	if len(f) != 7 || (f[0] != "tcp" && f[0] != "udp") {
		return Mark{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(f[1])
	if err != nil {
		return Mark{}, false
	}
	addr, ok := netip.AddrFromSlice(raw)
	if !ok {
		return Mark{}, false
	}
	port, err := strconv.ParseUint(f[2], 36, 16)
	if err != nil || port == 0 {
		return Mark{}, false
	}
	pid, err := strconv.ParseInt(f[3], 36, 32)
	if err != nil || pid <= 0 {
		return Mark{}, false
	}
	start, err := strconv.ParseInt(f[4], 36, 64)
	if err != nil {
		return Mark{}, false
	}
	pidNS, err := strconv.ParseUint(f[5], 36, 64)
	if err != nil {
		return Mark{}, false
	}
	timeNS, err := strconv.ParseUint(f[6], 36, 64)
	if err != nil {
		return Mark{}, false
	}
	return Mark{Protocol: f[0], Addr: addr, Port: uint16(port), PID: int(pid), Start: start, PidNS: pidNS, TimeNS: timeNS}, true
}

// held are the marks this process holds, by name.
var (
	mu   sync.Mutex // guards held
	held = map[string]closer{}
)

type closer interface{ Close() error }

// ErrTooMany is returned by Hold when the process holds as many marks as
// it may (see Limit).
var ErrTooMany = errors.New("marker: as many marks as the descriptor limit allows")

// Limit is the most marks a process holds at once: each is a descriptor,
// and a process that holds many reservations must keep descriptors for
// its own work. It is a quarter of the soft RLIMIT_NOFILE as the process
// started with it, at most 4096: a limit lowered later for a while makes
// the marks' sockets fail (and the reservations with them), not the marks
// go missing.
func Limit() int { return limitAtStart }

// limitAtStart is read when the package is initialised, after the runtime
// has raised the soft descriptor limit to the hard one: a limit a program
// lowers later, for a while, must not shrink it for good.
var limitAtStart = limit()

// Hold binds m's mark in namespace ns for this process, once, and reports
// whether it made it now: holding a mark that the process holds already
// does nothing and reports false. A name still bound by a socket of this
// process's that lives on in a child being started is waited for (at most
// inUseTries times inUseWait). An error (the OS refused a socket, the name
// stayed bound, or the process holds Limit marks) leaves no mark; the
// caller decides whether its reservation stands without one.
func Hold(ns string, m Mark) (bool, error) {
	if !Supported() {
		return false, nil
	}
	name := m.name(ns)
	mu.Lock()
	defer mu.Unlock()
	if _, ok := held[name]; ok {
		return false, nil
	}
	if len(held) >= Limit() {
		return false, ErrTooMany
	}
	for tries := 1; ; tries++ {
		c, err := bind(name)
		if err == nil {
			held[name] = c
			return true, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || tries >= inUseTries {
			return false, fmt.Errorf("marker %s: %w", name, err)
		}
		// The name is still bound: the socket of a mark this process
		// dropped a moment ago lives on in a child that another
		// goroutine is starting (a fork holds every descriptor until
		// its exec closes them). Bound to the name, it is the mark for
		// now, but it goes with that exec: wait for it to go, and bind
		// the name for this process.
		mu.Unlock()
		time.Sleep(inUseWait)
		mu.Lock()
		if _, ok := held[name]; ok {
			return false, nil // made meanwhile by another goroutine
		}
	}
}

// A name still bound when Hold binds it is tried inUseTries times,
// inUseWait apart.
const (
	inUseTries = 200
	inUseWait  = time.Millisecond
)

// Holds reports whether this process holds m's mark in namespace ns.
func Holds(ns string, m Mark) bool {
	mu.Lock()
	defer mu.Unlock()
	_, ok := held[m.name(ns)]
	return ok
}

// Drop closes m's mark in namespace ns, if this process holds it, and
// reports whether it did.
func Drop(ns string, m Mark) bool {
	name := m.name(ns)
	mu.Lock()
	c, ok := held[name]
	delete(held, name)
	mu.Unlock()
	if ok {
		_ = c.Close()
	}
	return ok
}

// DropAll closes every mark of namespace ns this process holds.
func DropAll(ns string) {
	mu.Lock()
	var drop []closer
	for name, c := range held {
		if strings.HasPrefix(name, prefix+ns+"/") {
			drop = append(drop, c)
			delete(held, name)
		}
	}
	mu.Unlock()
	for _, c := range drop {
		_ = c.Close()
	}
}

// Prune closes the marks of namespace ns this process holds for which
// keep reports false.
func Prune(ns string, keep func(Mark) bool) {
	mu.Lock()
	var names []string
	for name := range held {
		names = append(names, name)
	}
	mu.Unlock()
	for _, name := range names {
		m, ok := parse(ns, name)
		if !ok || keep(m) {
			continue
		}
		Drop(ns, m)
	}
}

// Inherit makes every mark this process holds pass through exec, for a
// process that is about to replace itself with another program, which
// keeps its pid and so the reservations the marks guard. The marks move
// to descriptors from 64 up, out of the way of those a program is handed
// from 3 up (LISTEN_FDS).
func Inherit() error {
	mu.Lock()
	defer mu.Unlock()
	for name, c := range held {
		n, err := inherit(c)
		if err != nil {
			return fmt.Errorf("marker %s: %w", name, err)
		}
		held[name] = n
	}
	return nil
}

// List returns the marks of namespace ns that live processes hold, this
// one included.
//
// The kernel shows its table of unix sockets a page at a time, and finds
// its place again for the next page by counting the sockets of a hash
// bucket: a socket of that bucket closed in between shifts the count, and
// the next page skips a socket that was there all along. On a host where
// sockets come and go (marks are made and dropped with every grant), one
// read misses a live mark now and then. List therefore reads the table
// again until a read finds no mark that the reads before it had not, at
// least minReads times and at most maxReads, and returns every mark any
// read found (one seen once was held at that moment; a holder that has
// gone since is dropped by whoever checks its owner).
func List(ns string) ([]Mark, error) {
	if !Supported() {
		return nil, nil
	}
	seen := map[Mark]bool{}
	var out []Mark
	for reads := 1; ; reads++ {
		names, err := boundNames()
		if err != nil {
			return nil, err
		}
		added := false
		for _, n := range names {
			if m, ok := parse(ns, n); ok && !seen[m] {
				seen[m] = true
				out = append(out, m)
				added = true
			}
		}
		if reads >= maxReads || (reads >= minReads && !added) {
			return out, nil
		}
	}
}

// The bounds of the reads of List. Three reads in a row missed no live
// mark of 200 held while other sockets were made and closed as fast as two
// goroutines could (one read alone missed about one in a thousand);
// TestListUnderChurn holds List to that.
const (
	minReads = 3
	maxReads = 12
)
