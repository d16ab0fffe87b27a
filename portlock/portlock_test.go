//go:build unix

package portlock_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/portlock"
)

// freshPort returns a port that no lock of tcp or udp is held for, from a
// range no berth uses by default, so tests of one run do not meet the
// locks of another package's tests.
func freshPort(tb testing.TB) uint16 {
	tb.Helper()
	for range 1000 {
		p := uint16(40000 + rand.IntN(8000))
		free := true
		for _, network := range []string{"tcp", "udp"} {
			l, err := portlock.Acquire(network, netip.IPv6Unspecified(), p)
			if err != nil {
				free = false
				break
			}
			_ = l.Close()
		}
		if free {
			return p
		}
	}
	tb.Fatal("no port without locks")
	return 0
}

func acquire(tb testing.TB, network, addr string, port uint16) *portlock.Lock {
	tb.Helper()
	l, err := portlock.Acquire(network, mustAddr(addr), port)
	if err != nil {
		tb.Fatalf("Acquire(%s %s:%d) = %v; want the lock", network, addr, port, err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

func TestConflictRule(t *testing.T) {
	tests := []struct {
		held, asked string
		network     string // of asked; zero: tcp
		conflict    bool
	}{
		{"127.0.0.1", "127.0.0.1", "", true},
		{"127.0.0.1", "127.0.0.2", "", false},
		{"127.0.0.1", "::1", "", false},
		{"::1", "::1", "", true},
		{"127.0.0.1", "0.0.0.0", "", true},
		{"0.0.0.0", "127.0.0.1", "", true},
		{"127.0.0.1", "::", "", true},
		{"::", "127.0.0.1", "", true},
		{"::1", "0.0.0.0", "", true},
		{"0.0.0.0", "::1", "", true},
		{"0.0.0.0", "::", "", true},
		{"::", "0.0.0.0", "", true},
		{"0.0.0.0", "0.0.0.0", "", true},
		{"::ffff:127.0.0.1", "127.0.0.1", "", true},
		{"192.168.7.1", "fe80::1", "", false},
		{"127.0.0.1", "127.0.0.1", "udp", false},
		{"0.0.0.0", "127.0.0.1", "udp", false},
	}
	for _, tt := range tests {
		network := tt.network
		if network == "" {
			network = "tcp"
		}
		t.Run(tt.held+"/"+network+"-"+tt.asked, func(t *testing.T) {
			p := freshPort(t)
			acquire(t, "tcp", tt.held, p)
			l, err := portlock.Acquire(network, mustAddr(tt.asked), p)
			if tt.conflict {
				var he *portlock.HeldError
				if !errors.As(err, &he) || !errors.Is(err, portlock.ErrHeld) {
					t.Fatalf("Acquire(%s %s) with tcp %s held = %v; want a *HeldError", network, tt.asked, tt.held, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Acquire(%s %s) with tcp %s held = %v; want the lock", network, tt.asked, tt.held, err)
			}
			_ = l.Close()
		})
	}
}

func TestClose(t *testing.T) {
	p := freshPort(t)
	l := acquire(t, "tcp", "127.0.0.1", p)
	if _, err := portlock.Acquire("tcp", mustAddr("127.0.0.1"), p); !errors.Is(err, portlock.ErrHeld) {
		t.Fatalf("second Acquire = %v; want ErrHeld", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close = %v; want nil", err)
	}
	acquire(t, "tcp", "0.0.0.0", p) // the slot went with the address
}

// slots is how many specific addresses of one port the package doc says
// may be locked at once.
const slots = 8

func TestSlots(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("slots are the abstract namespace's")
	}
	p := freshPort(t)
	var ls []*portlock.Lock
	for i := 1; i <= slots; i++ {
		ls = append(ls, acquire(t, "tcp", "127.0.0."+strconv.Itoa(i), p))
	}
	_, err := portlock.Acquire("tcp", mustAddr("127.0.0.100"), p)
	var he *portlock.HeldError
	if !errors.As(err, &he) || !he.Slots {
		t.Fatalf("Acquire of address %d = %v; want a *HeldError with slots", slots+1, err)
	}
	if _, err := portlock.Acquire("tcp", mustAddr("0.0.0.0"), p); !errors.Is(err, portlock.ErrHeld) {
		t.Fatalf("wildcard Acquire with %d addresses held = %v; want ErrHeld", slots, err)
	}
	_ = ls[3].Close()
	acquire(t, "tcp", "127.0.0.100", p)
}

func TestBadInput(t *testing.T) {
	for _, tt := range []struct {
		network string
		addr    netip.Addr
		port    uint16
	}{
		{"sctp", mustAddr("127.0.0.1"), 1},
		{"tcp", netip.Addr{}, 1},
		{"tcp", mustAddr("fe80::1%eth0"), 1},
		{"tcp", mustAddr("127.0.0.1"), 0},
	} {
		if _, err := portlock.Acquire(tt.network, tt.addr, tt.port); err == nil || errors.Is(err, portlock.ErrHeld) {
			t.Errorf("Acquire(%q, %v, %d) = %v; want an error naming the input", tt.network, tt.addr, tt.port, err)
		}
	}
}

func TestTakeProbes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := uint16(ln.Addr().(*net.TCPAddr).Port)
	_, err = portlock.Take("tcp", mustAddr("127.0.0.1"), p)
	var he *portlock.HeldError
	if !errors.As(err, &he) || !he.Bound {
		t.Fatalf("Take of a bound port = %v; want a *HeldError with Bound", err)
	}
	// The lock went with the refusal.
	acquire(t, "tcp", "127.0.0.1", p)
	if free, err := portlock.Probe("tcp", mustAddr("0.0.0.0"), p); err != nil || free {
		t.Fatalf("Probe(0.0.0.0) of a port bound on 127.0.0.1 = %v, %v; want false", free, err)
	}
}

func init() {
	roles["hold"] = func(args []string) int {
		p, _ := strconv.Atoi(args[2])
		l, err := portlock.Acquire(args[0], netip.MustParseAddr(args[1]), uint16(p))
		if err != nil {
			println(err.Error())
			return 1
		}
		defer l.Close()
		os.Stdout.WriteString("held\n")
		_, _ = os.Stdin.Read(make([]byte, 1)) // until the test closes stdin, or kills us
		return 0
	}
}

func TestDiesWithHolder(t *testing.T) {
	p := freshPort(t)
	w := start(t, "hold", "tcp", "::", strconv.Itoa(int(p)))
	if got := w.next(t); got != "held" {
		t.Fatalf("worker said %q", got)
	}
	if _, err := portlock.Acquire("tcp", mustAddr("127.0.0.1"), p); !errors.Is(err, portlock.ErrHeld) {
		t.Fatalf("Acquire under another process's wildcard = %v; want ErrHeld", err)
	}
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
	// The kernel released it with the process: no wait, no cleanup.
	acquire(t, "tcp", "127.0.0.1", p)
}

func TestSquatter(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("names of the abstract namespace")
	}
	p := freshPort(t)
	// A program that is not berth binds a lock's name.
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: "@berth/1/tcp/" + strconv.Itoa(int(p)) + "/127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := portlock.Acquire("tcp", mustAddr("127.0.0.1"), p); !errors.Is(err, portlock.ErrHeld) {
		t.Fatalf("Acquire of a squatted name = %v; want ErrHeld", err)
	}
	held, err := portlock.List()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, h := range held {
		if h.Port == p && h.Addr == mustAddr("127.0.0.1") {
			found = true
			if len(h.PIDs) != 1 || h.PIDs[0] != os.Getpid() {
				t.Errorf("List: the squatted lock's holders = %v; want [%d]", h.PIDs, os.Getpid())
			}
		}
	}
	if !found {
		t.Fatalf("List = %v; want the squatted lock of port %d", held, p)
	}
	// Another address of the port is still free: a squatter denies what it
	// squats, nothing more.
	acquire(t, "tcp", "127.0.0.2", p)
}

// TestSquatterOfAnyKind: a datagram socket bound to a lock's name holds
// it, listening or not: the lock of that name is refused, and so is every
// lock whose check meets it (a wildcard squatted refuses the port's
// specific addresses; a slot squatted refuses the wildcard), with ErrHeld,
// and List shows the squatter. The kernel keeps a name per socket type, so
// a socket of another type bound to the same name is no lock: it neither
// denies the port nor shows in List.
func TestSquatterOfAnyKind(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("names of the abstract namespace")
	}
	for _, typ := range []struct {
		name    string
		typ     int
		listen  bool
		denying bool
	}{
		{"datagram", syscall.SOCK_DGRAM, false, true},
		{"connected datagram", syscall.SOCK_DGRAM, true, true},
		{"stream", syscall.SOCK_STREAM, false, false},
		{"listening stream", syscall.SOCK_STREAM, true, false},
		{"seqpacket", syscall.SOCK_SEQPACKET, true, false},
	} {
		for _, squat := range []struct{ tag, ask string }{{"*", "127.0.0.1"}, {"*", "::1"}, {"s0", "0.0.0.0"}, {"s7", "::"}, {"127.0.0.1", "127.0.0.1"}} {
			p := freshPort(t)
			fd, err := syscall.Socket(syscall.AF_UNIX, typ.typ, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: "@berth/1/tcp/" + strconv.Itoa(int(p)) + "/" + squat.tag}); err != nil {
				t.Fatal(err)
			}
			switch {
			case typ.listen && typ.typ == syscall.SOCK_DGRAM:
				// Connected to a socket of its own, it refuses others.
				peer, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer syscall.Close(peer)
				if err := syscall.Bind(peer, &syscall.SockaddrUnix{Name: "@berth-test-peer/" + strconv.Itoa(int(p))}); err != nil {
					t.Fatal(err)
				}
				if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: "@berth-test-peer/" + strconv.Itoa(int(p))}); err != nil {
					t.Fatal(err)
				}
			case typ.listen:
				if err := syscall.Listen(fd, 1); err != nil {
					t.Fatal(err)
				}
			}
			l, err := portlock.Acquire("tcp", mustAddr(squat.ask), p)
			switch {
			case typ.denying && !errors.Is(err, portlock.ErrHeld):
				t.Errorf("%s squatting %q: Acquire(%s) = %v, %v; want ErrHeld", typ.name, squat.tag, squat.ask, l, err)
			case !typ.denying && err != nil:
				t.Errorf("%s bound to %q: Acquire(%s) = %v; want the lock: a name is held per socket type", typ.name, squat.tag, squat.ask, err)
			}
			if l != nil {
				_ = l.Close()
			}
			if squat.tag != "s0" && squat.tag != "s7" {
				held, err := portlock.List()
				if err != nil {
					t.Fatal(err)
				}
				listed := slices.ContainsFunc(held, func(h portlock.Held) bool { return h.Port == p })
				if listed != typ.denying {
					t.Errorf("%s squatting %q: listed %v; want %v", typ.name, squat.tag, listed, typ.denying)
				}
			}
			_ = syscall.Close(fd)
		}
	}
}

func TestList(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("List reads the abstract namespace")
	}
	p := freshPort(t)
	acquire(t, "udp", "::1", p)
	acquire(t, "tcp", "0.0.0.0", p)
	held, err := portlock.List()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"udp [::1]": false, "tcp *": false}
	for _, h := range held {
		if h.Port != p {
			continue
		}
		k := h.Network + " *"
		if h.Addr.IsValid() {
			k = h.Network + " [" + h.Addr.String() + "]"
		}
		if _, ok := want[k]; !ok {
			t.Errorf("List has %s of port %d; want only %v", k, p, want)
		}
		want[k] = true
		if len(h.PIDs) != 1 || h.PIDs[0] != os.Getpid() {
			t.Errorf("List: %s held by %v; want [%d]", k, h.PIDs, os.Getpid())
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("List lacks %s of port %d", k, p)
		}
	}
}

func init() {
	roles["sleep"] = func([]string) int {
		os.Stdout.WriteString("up\n")
		_, _ = os.Stdin.Read(make([]byte, 1))
		return 0
	}
}

func TestInheritedByChild(t *testing.T) {
	p := freshPort(t)
	l, err := portlock.Acquire("tcp", mustAddr("127.0.0.1"), p)
	if err != nil {
		t.Fatal(err)
	}
	files, err := l.Files()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envRole+"=sleep")
	cmd.ExtraFiles = files
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		_ = f.Close()
	}
	_ = l.Close()
	if runtime.GOOS == "linux" && !l.HeldBy(cmd.Process.Pid) {
		// l is closed: HeldBy has nothing to compare any more.
		t.Log("HeldBy of a closed lock is false, as documented")
	}
	if _, err := portlock.Acquire("tcp", mustAddr("0.0.0.0"), p); !errors.Is(err, portlock.ErrHeld) {
		t.Fatalf("Acquire while a child holds the inherited lock = %v; want ErrHeld", err)
	}
	_ = stdin.Close()
	_ = cmd.Wait()
	acquire(t, "tcp", "0.0.0.0", p)
}

func TestHeldBy(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("HeldBy reads /proc")
	}
	p := freshPort(t)
	l := acquire(t, "udp", "127.0.0.1", p)
	files, err := l.Files()
	if err != nil {
		t.Fatal(err)
	}
	w := startWith(t, files, "sleep")
	for _, f := range files {
		_ = f.Close()
	}
	if !l.HeldBy(os.Getpid()) || !l.HeldBy(w.cmd.Process.Pid) {
		t.Fatalf("HeldBy(self), HeldBy(child) = %v, %v; want true, true", l.HeldBy(os.Getpid()), l.HeldBy(w.cmd.Process.Pid))
	}
	other := start(t, "sleep")
	other.next(t)
	if l.HeldBy(other.cmd.Process.Pid) {
		t.Fatal("HeldBy of a process without the lock = true")
	}
}

func init() {
	roles["exec"] = func(args []string) int {
		p, _ := strconv.Atoi(args[0])
		l, err := portlock.Acquire("tcp", netip.MustParseAddr("127.0.0.1"), uint16(p))
		if err != nil {
			println(err.Error())
			return 1
		}
		if err := l.Inherit(); err != nil {
			println(err.Error())
			return 1
		}
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, envRole+"=") {
				env = append(env, kv)
			}
		}
		env = append(env, envRole+"=sleep")
		err = syscall.Exec("/proc/self/exe", []string{os.Args[0]}, env)
		println(err.Error())
		return 1
	}
}

func TestInheritAcrossExec(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the test execs /proc/self/exe")
	}
	p := freshPort(t)
	w := start(t, "exec", strconv.Itoa(int(p)))
	if got := w.next(t); got != "up" {
		t.Fatalf("worker said %q", got)
	}
	if _, err := portlock.Acquire("tcp", mustAddr("127.0.0.1"), p); !errors.Is(err, portlock.ErrHeld) {
		t.Fatalf("Acquire of a lock the exec'd program kept = %v; want ErrHeld", err)
	}
	_ = w.cmd.Process.Kill()
	_ = w.cmd.Wait()
	acquire(t, "tcp", "127.0.0.1", p)
}

func init() {
	// race takes keys of one port at random for a while, and while it
	// holds one it binds the port itself, as the key's holder would: a
	// bind that fails means another worker holds a conflicting key at the
	// same time. It prints how many it got, how many it was refused, and
	// the failed binds.
	roles["race"] = func(args []string) int {
		p, _ := strconv.Atoi(args[0])
		d, _ := time.ParseDuration(args[1])
		keys := []string{"0.0.0.0", "::", "127.0.0.1", "::1", "127.0.0.2"}
		var got, refused, bad int
		for end := time.Now().Add(d); time.Now().Before(end); {
			a := netip.MustParseAddr(keys[rand.IntN(len(keys))])
			l, err := portlock.Acquire("tcp", a, uint16(p))
			if err != nil {
				if !errors.Is(err, portlock.ErrHeld) {
					println(err.Error())
					return 1
				}
				refused++
				continue
			}
			got++
			if !bindFor(a, uint16(p)) {
				bad++
			}
			_ = l.Close()
		}
		os.Stdout.WriteString(strconv.Itoa(got) + " " + strconv.Itoa(refused) + " " + strconv.Itoa(bad) + "\n")
		return 0
	}
}

// bindFor binds a TCP socket to a:p (a wildcard as a dual-stack ::, as Go
// and berth's probe bind it), holds it a moment, and reports whether the
// bind succeeded.
func bindFor(a netip.Addr, p uint16) bool {
	family := syscall.AF_INET6
	var sa syscall.Sockaddr = &syscall.SockaddrInet6{Port: int(p), Addr: a.As16()}
	if a.Is4() && !a.IsUnspecified() {
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: int(p), Addr: a.As4()}
	} else if a.Is4() {
		sa = &syscall.SockaddrInet6{Port: int(p)}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, 0)
	if err != nil {
		return false
	}
	defer syscall.Close(fd)
	if family == syscall.AF_INET6 {
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0)
	}
	if err := syscall.Bind(fd, sa); err != nil {
		return false
	}
	time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
	return true
}

// TestRaceConflictingKeys races processes for wildcard and specific keys of
// one port, IPv4 and IPv6: no two may hold conflicting keys at once, which
// each checks by binding the port itself while it holds its key.
func TestRaceConflictingKeys(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the races need the abstract namespace")
	}
	if _, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skip("no IPv6 loopback")
	}
	const workers = 8
	for round := range 3 {
		p := freshPort(t)
		if free, _ := portlock.Probe("tcp", netip.IPv6Unspecified(), p); !free {
			continue
		}
		var ws []*worker
		for range workers {
			ws = append(ws, start(t, "race", strconv.Itoa(int(p)), "1s"))
		}
		var got, refused int
		for _, w := range ws {
			var g, r, bad int
			if _, err := fmt.Sscan(w.next(t), &g, &r, &bad); err != nil {
				t.Fatal(err)
			}
			if bad > 0 {
				t.Errorf("round %d, port %d: %d binds failed while their worker held the key: two workers held conflicting keys at once", round, p, bad)
			}
			got, refused = got+g, refused+r
		}
		t.Logf("round %d, port %d: %d grants, %d refusals", round, p, got, refused)
		if got < workers || refused < workers {
			t.Errorf("round %d: %d grants, %d refusals; want a contended race", round, got, refused)
		}
	}
}
