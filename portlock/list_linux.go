package portlock

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

func list() ([]Held, error) {
	// The kernel shows its socket table a page at a time and can skip a
	// socket that was there all along when others come and go in between:
	// two reads miss less.
	byInode := map[uint64]Held{}
	for range 2 {
		if err := readLocks(byInode); err != nil {
			return nil, err
		}
	}
	if len(byInode) == 0 {
		return nil, nil
	}
	pids := socketOwners(byInode)
	out := make([]Held, 0, len(byInode))
	var squat []Held
	for ino, h := range byInode {
		h.PIDs = pids[ino]
		if h.slot {
			squat = append(squat, h)
		} else {
			out = append(out, h)
		}
	}
	// A slot name stands for the address lock beside it. Held alone (by a
	// program that is not berth), it denies the port's wildcard: it is
	// shown as a lock of the wildcard, held by those processes.
	for _, s := range squat {
		samePort := func(h Held) bool { return h.Network == s.Network && h.Port == s.Port }
		for _, pid := range s.PIDs {
			if slices.ContainsFunc(out, func(h Held) bool { return samePort(h) && slices.Contains(h.PIDs, pid) }) {
				continue
			}
			i := slices.IndexFunc(out, func(h Held) bool { return samePort(h) && !h.Addr.IsValid() })
			if i < 0 {
				out = append(out, Held{Network: s.Network, Port: s.Port})
				i = len(out) - 1
			}
			out[i].PIDs = append(out[i].PIDs, pid)
		}
	}
	for i := range out {
		slices.Sort(out[i].PIDs)
		out[i].PIDs = slices.Compact(out[i].PIDs)
	}
	slices.SortFunc(out, func(a, b Held) int {
		return cmp.Or(cmp.Compare(a.Network, b.Network), cmp.Compare(a.Port, b.Port), a.Addr.Compare(b.Addr))
	})
	return out, nil
}

// readLocks adds the lock names bound in this network namespace to m, by
// the inode of their socket.
func readLocks(m map[uint64]Held) error {
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return fmt.Errorf("portlock: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		// Num RefCount Protocol Flags Type St Inode Path: a lock is a
		// datagram socket (Type 0002); a name is held per type, so a
		// socket of another type bound to it is no lock.
		f := strings.Fields(line)
		if len(f) < 8 || f[4] != "0002" || !strings.HasPrefix(f[7], "@"+prefix) {
			continue
		}
		h, ok := parseName(f[7][1+len(prefix):])
		if ino, err := strconv.ParseUint(f[6], 10, 64); ok && err == nil {
			m[ino] = h
		}
	}
	return nil
}

// parseName reads "tcp/24989/127.0.0.1", "tcp/24989/*" or a slot,
// "tcp/24989/s3"; false for a name of something else.
func parseName(n string) (Held, bool) {
	parts := strings.Split(n, "/")
	if len(parts) != 3 || (parts[0] != "tcp" && parts[0] != "udp") {
		return Held{}, false
	}
	port, err := strconv.ParseUint(parts[1], 10, 16)
	if err != nil || port == 0 {
		return Held{}, false
	}
	h := Held{Network: parts[0], Port: uint16(port)}
	if parts[2] == "*" {
		return h, true
	}
	if i, err := strconv.Atoi(strings.TrimPrefix(parts[2], "s")); err == nil && parts[2] == slotTag(i) && i < slots {
		h.slot = true
		return h, true
	}
	h.Addr, err = netip.ParseAddr(parts[2])
	return h, err == nil
}

// socketOwners finds, for each socket inode of want, the processes with a
// descriptor of it.
func socketOwners(want map[uint64]Held) map[uint64][]int {
	out := map[uint64][]int{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		for _, ino := range sockets(pid) {
			if _, ok := want[ino]; ok {
				out[ino] = append(out[ino], pid) // list drops repeats
			}
		}
	}
	return out
}

// sockets returns the inodes of the sockets process pid has descriptors of:
// none when it is gone, or another user's.
func sockets(pid int) []uint64 {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	fds, _ := os.ReadDir(dir)
	var out []uint64
	for _, fd := range fds {
		l, err := os.Readlink(dir + fd.Name())
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		if ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"), 10, 64); err == nil {
			out = append(out, ino)
		}
	}
	return out
}
