//go:build !linux

package portlock

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Where the abstract unix namespace does not exist, a lock is a lock of a
// file in LockDir: a port's own file (tcp-24989), locked exclusively by a
// wildcard and shared by every specific address, and an address's file
// (tcp-24989-127.0.0.1), locked exclusively by that address. The files are
// never removed: removing one while another process opens it would let two
// processes lock two different files of one name.

// LockDir returns the directory of the lock files on systems without the
// abstract unix namespace, which every user of the host can write.
func LockDir() string { return lockDir }

// lockedFile is a file locked by this process.
type lockedFile struct{ f *os.File }

func (l lockedFile) Close() error { return l.f.Close() }
func (l lockedFile) fd() uintptr  { return l.f.Fd() }

func fileName(network string, port uint16, addr netip.Addr) string {
	n := network + "-" + strconv.Itoa(int(port))
	if addr.IsValid() {
		// ":" is not allowed in a Windows file name.
		n += "-" + strings.ReplaceAll(addr.String(), ":", "_")
	}
	return filepath.Join(lockDir, n)
}

func lockFile(path string, exclusive bool) (handle, bool, error) {
	if err := os.MkdirAll(lockDir, 0o777); err != nil {
		return nil, false, err
	}
	_ = os.Chmod(lockDir, 0o777|os.ModeSticky) // created by this user: let every user add files
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, false, err
	}
	_ = f.Chmod(0o666)
	ok, err := tryLock(f, exclusive)
	if err != nil || !ok {
		_ = f.Close()
		return nil, false, err
	}
	return lockedFile{f}, true, nil
}

func acquire(network string, addr netip.Addr, port uint16) ([]handle, error) {
	held := &HeldError{Network: network, Addr: addr, Port: port}
	wild := addr.IsUnspecified()
	gate, ok, err := lockFile(fileName(network, port, netip.Addr{}), wild)
	switch {
	case err != nil:
		return nil, fmt.Errorf("portlock: %w", err)
	case !ok && !wild:
		held.In = netip.IPv4Unspecified()
		if addr.Is6() {
			held.In = netip.IPv6Unspecified()
		}
		return nil, held
	case !ok:
		return nil, held // a wildcard or a specific address holds the port
	case wild:
		return []handle{gate}, nil
	}
	own, ok, err := lockFile(fileName(network, port, addr), true)
	if err != nil || !ok {
		_ = gate.Close()
		if err != nil {
			return nil, fmt.Errorf("portlock: %w", err)
		}
		held.In = addr
		return nil, held
	}
	return []handle{gate, own}, nil
}

func dupFile(h handle, _ string) (*os.File, error) { return dup(h.(lockedFile).f) }

func inherit(h handle) (handle, error) { return h, nil }

func heldBy(int, handle) bool { return false }

// No keepers and no List where locks are files.
func (k Keeper) hold(time.Duration, []*Lock) error { return ErrNoKeeper }
func (k Keeper) drop(string) (bool, error)         { return false, nil }
func (k Keeper) renew(time.Duration) (int, error)  { return 0, ErrNoKeeper }
func (k Keeper) take(string) ([]handle, error)     { return nil, nil }
func startOf(int) (uint64, error)                  { return 0, nil }
func list() ([]Held, error)                        { return nil, nil }
