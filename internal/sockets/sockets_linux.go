package sockets

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// tables are the files of the sockets of this network namespace.
var tables = []struct{ proto, path string }{
	{"tcp", "/proc/net/tcp"}, {"tcp", "/proc/net/tcp6"},
	{"udp", "/proc/net/udp"}, {"udp", "/proc/net/udp6"},
}

// tcpStates names the states of include/net/tcp_states.h.
var tcpStates = map[uint64]string{
	1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
	7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV",
}

// List returns the sockets of this network namespace whose local port
// want accepts (nil: every port). A table the kernel does not have (IPv6
// disabled) is skipped.
func List(want func(uint16) bool) ([]Socket, error) {
	var out []Socket
	for _, t := range tables {
		b, err := os.ReadFile(t.path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", t.path, err)
		}
		ss, err := parseTable(t.proto, b, want)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.path, err)
		}
		out = append(out, ss...)
	}
	return out, nil
}

// parseTable parses one of the /proc/net tables of proto.
func parseTable(proto string, b []byte, want func(uint16) bool) ([]Socket, error) {
	var out []Socket
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if n == 1 { // the header
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			return nil, fmt.Errorf("line %d has %d fields; want at least 10", n, len(f))
		}
		local, err := parseAddrPort(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: local address %q: %w", n, f[1], err)
		}
		if want != nil && !want(local.Port()) {
			continue
		}
		remote, err := parseAddrPort(f[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: remote address %q: %w", n, f[2], err)
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("line %d: state %q: %w", n, f[3], err)
		}
		uid, err := strconv.Atoi(f[7])
		if err != nil {
			return nil, fmt.Errorf("line %d: uid %q: %w", n, f[7], err)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: inode %q: %w", n, f[9], err)
		}
		state := tcpStates[st]
		if proto == "udp" {
			// UDP sockets borrow the TCP numbers: 7 unconnected, 1 connected.
			state = "UNCONN"
			if st == 1 {
				state = "ESTABLISHED"
			}
		}
		if state == "" {
			state = fmt.Sprintf("state %d", st)
		}
		out = append(out, Socket{Protocol: proto, Local: local, Remote: remote, State: state, UID: uid, Inode: inode})
	}
	return out, sc.Err()
}

// parseAddrPort parses "0100007F:4E20" or the IPv6 form: the address as
// the kernel prints it, 32-bit words in host byte order, then the port.
func parseAddrPort(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no ':'")
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port: %w", err)
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, errors.New("want 8 or 32 hex digits")
	}
	// Each word was printed as a number of the host's byte order: put its
	// bytes back in the order they had in memory.
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}

// Holders returns, for each inode of want, the processes that hold it
// open, by pid in increasing order. Processes whose descriptors the caller
// may not read (another user's, unless it is root) are left out.
func Holders(want map[uint64]bool) (map[uint64][]int, error) {
	out := map[uint64][]int{}
	if len(want) == 0 {
		return out, nil
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := "/proc/" + d.Name() + "/fd"
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // exited, or not ours to read
		}
		seen := map[uint64]bool{}
		for _, fd := range fds {
			l, err := os.Readlink(fdDir + "/" + fd.Name())
			if err != nil {
				continue
			}
			num, ok := strings.CutPrefix(l, "socket:[")
			if !ok {
				continue
			}
			ino, err := strconv.ParseUint(strings.TrimSuffix(num, "]"), 10, 64)
			if err != nil || !want[ino] || seen[ino] {
				continue
			}
			seen[ino] = true
			out[ino] = append(out[ino], pid) // /proc lists pids in increasing order
		}
	}
	return out, nil
}

// Inspect reads what a person wants to know of process pid: its user,
// name and command line. It returns an error wrapping fs.ErrNotExist
// when the process has exited.
func Inspect(pid int) (Process, error) {
	p := Process{PID: pid, UID: -1}
	dir := "/proc/" + strconv.Itoa(pid)
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return p, fmt.Errorf("process %d: %w", pid, err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				p.UID, _ = strconv.Atoi(f[0])
			}
		}
		if v, ok := strings.CutPrefix(line, "Name:"); ok {
			p.Name = strings.TrimSpace(v)
		}
	}
	if cmd, err := os.ReadFile(dir + "/cmdline"); err == nil && len(cmd) > 0 {
		p.Args = strings.Split(string(bytes.TrimSuffix(cmd, []byte{0})), "\x00")
	}
	return p, nil
}
