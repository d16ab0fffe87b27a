package portlock

import (
	"bufio"
	"bytes"
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
	// A slot name stands for the address lock beside it. Held alone (by a
	// program that is not berth), it denies the port's wildcard: it is
	// shown as a lock of the wildcard, held by those processes.
	type portOf struct {
		network string
		port    uint16
	}
	locked := map[portOf]map[int]bool{}
	for ino, h := range byInode {
		if h.slot {
			continue
		}
		k := portOf{h.Network, h.Port}
		if locked[k] == nil {
			locked[k] = map[int]bool{}
		}
		for _, pid := range pids[ino] {
			locked[k][pid] = true
		}
	}
	wild := map[portOf]*Held{}
	out := make([]Held, 0, len(byInode))
	for ino, h := range byInode {
		if !h.slot {
			h.PIDs = pids[ino]
			out = append(out, h)
			continue
		}
		k := portOf{h.Network, h.Port}
		for _, pid := range pids[ino] {
			if locked[k][pid] {
				continue
			}
			if wild[k] == nil {
				wild[k] = &Held{Network: h.Network, Port: h.Port}
			}
			wild[k].PIDs = append(wild[k].PIDs, pid)
		}
	}
	for k, w := range wild {
		i := slices.IndexFunc(out, func(h Held) bool { return h.Network == k.network && h.Port == k.port && !h.Addr.IsValid() })
		if i < 0 {
			out = append(out, *w)
		} else {
			out[i].PIDs = append(out[i].PIDs, w.PIDs...)
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
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path: a lock is a
		// datagram socket (Type 0002); a name is held per type, so a
		// socket of another type bound to it is no lock.
		f := bytes.Fields(sc.Bytes())
		if len(f) < 8 || string(f[4]) != "0002" || !bytes.HasPrefix(f[7], []byte("@"+prefix)) {
			continue
		}
		h, ok := parseName(string(f[7][1+len(prefix):]))
		if !ok {
			continue
		}
		ino, err := strconv.ParseUint(string(f[6]), 10, 64)
		if err != nil {
			continue
		}
		m[ino] = h
	}
	return sc.Err()
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
	a, err := netip.ParseAddr(parts[2])
	if err != nil {
		return Held{}, false
	}
	h.Addr = a
	return h, true
}

// socketOwners finds, for each socket inode of want, the processes with a
// descriptor of it.
func socketOwners(want map[uint64]Held) map[uint64][]int {
	out := map[uint64][]int{}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		dir := "/proc/" + p.Name() + "/fd/"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // gone, or another user's
		}
		seen := map[uint64]bool{}
		for _, fd := range fds {
			l, err := os.Readlink(dir + fd.Name())
			if err != nil || !strings.HasPrefix(l, "socket:[") {
				continue
			}
			ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"), 10, 64)
			if err != nil {
				continue
			}
			if _, ok := want[ino]; ok && !seen[ino] {
				seen[ino] = true
				out[ino] = append(out[ino], pid)
			}
		}
	}
	return out
}
