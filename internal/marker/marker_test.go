package marker

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testproc"
)

func init() {
	testproc.Register("hold", func() int {
		m := Mark{Protocol: "tcp", Addr: netip.MustParseAddr("::1"), Port: 24001, PID: os.Getpid(), Start: 1, PidNS: 4026531836}
		if _, err := Hold(os.Getenv("MARKER_NS"), m); err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Println("held")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the test closes stdin or kills us
		return 0
	})
}

func TestMain(m *testing.M) {
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}

func TestNameRoundTrip(t *testing.T) {
	ns := Namespace("/home/u/.local/state/berth/berth.db")
	for _, m := range []Mark{
		{Protocol: "tcp", Addr: netip.MustParseAddr("127.0.0.1"), Port: 20000, PID: 4242, Start: 123456, PidNS: 4026531836, TimeNS: 4026531834},
		{Protocol: "udp", Addr: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), Port: 65535, PID: 1<<31 - 1, Start: 1<<63 - 1, PidNS: 1<<64 - 1, TimeNS: 1<<64 - 1},
		{Protocol: "tcp", Addr: netip.IPv6Unspecified(), Port: 1, PID: 1},
	} {
		name := m.name(ns)
		// The kernel takes at most 107 bytes after the leading NUL.
		if len(name) > 107 {
			t.Errorf("len(%q) = %d; want at most 107", name, len(name))
		}
		got, ok := parse(ns, name)
		if !ok || got != m {
			t.Errorf("parse(name(%+v)) = %+v, %v; want the mark back", m, got, ok)
		}
		if _, ok := parse(Namespace("/other/berth.db"), name); ok {
			t.Errorf("parse in another namespace accepted %q", name)
		}
	}
}

func TestParseRefusesJunk(t *testing.T) {
	ns := Namespace("/x")
	if m, ok := parse(ns, prefix+ns+"/tcp/fwAAAQ/ilk/1/1/0/0"); !ok || m.Port != 24104 || m.Addr != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("parse of a good name = %+v, %v; want port 24104 on 127.0.0.1", m, ok)
	}
	for _, name := range []string{
		"", prefix, prefix + ns, prefix + ns + "/",
		prefix + ns + "/tcp/fwAAAQ/ilk/1/1/0/0!", // the good one, but for the last field
		prefix + ns + "/sctp/fwAAAQ/ilk/1/1/0/0",
		prefix + ns + "/tcp/%%%/ilk/1/1/0/0",
		prefix + ns + "/tcp/fwAA/ilk/1/1/0/0",    // 3 bytes: no address
		prefix + ns + "/tcp/fwAAAQ/0/1/1/0/0",    // port 0
		prefix + ns + "/tcp/fwAAAQ/1ekg/1/1/0/0", // port > 65535
		prefix + ns + "/tcp/fwAAAQ/ilk/0/1/0/0",  // pid 0
		prefix + ns + "/tcp/fwAAAQ/ilk/-1/1/0/0",
		prefix + ns + "/tcp/fwAAAQ/ilk/1/x!/0/0",
		prefix + ns + "/tcp/fwAAAQ/ilk/1/1//0",
		prefix + ns + "/tcp/fwAAAQ/ilk/1/1/0/0/extra",
	} {
		if m, ok := parse(ns, name); ok {
			t.Errorf("parse(%q) = %+v; want refused", name, m)
		}
	}
}

func TestHoldListDrop(t *testing.T) {
	if !Supported() {
		t.Skip("no abstract unix namespace on this system")
	}
	ns := Namespace(t.TempDir())
	m := Mark{Protocol: "udp", Addr: netip.MustParseAddr("127.0.0.1"), Port: 24002, PID: os.Getpid(), Start: 77}
	if made, err := Hold(ns, m); !made || err != nil {
		t.Fatalf("Hold = %v, %v; want true, nil", made, err)
	}
	if made, err := Hold(ns, m); made || err != nil { // held already: nothing to do
		t.Fatalf("second Hold = %v, %v; want false, nil", made, err)
	}
	got, err := List(ns)
	if err != nil || !slices.Equal(got, []Mark{m}) {
		t.Fatalf("List = %v, %v; want [%v]", got, err, m)
	}
	Drop(ns, m)
	if got, err := List(ns); err != nil || len(got) != 0 {
		t.Fatalf("List after Drop = %v, %v; want none", got, err)
	}
}

// A mark survives the removal of every file and vanishes with its process.
func TestMarkVanishesWithItsProcess(t *testing.T) {
	if !Supported() {
		t.Skip("no abstract unix namespace on this system")
	}
	ns := Namespace(t.TempDir())
	cmd := testproc.Command(t, "hold")
	cmd.Env = append(cmd.Env, "MARKER_NS="+ns)
	stdin, stdout := testproc.Start(t, cmd)
	defer func() { _ = stdin.Close() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "held" {
		t.Fatalf("worker said %q, %v; want held", line, err)
	}
	got, err := List(ns)
	if err != nil || len(got) != 1 || got[0].PID != cmd.Process.Pid || got[0].Port != 24001 {
		t.Fatalf("List = %v, %v; want the worker's mark of port 24001", got, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := List(ns)
		if err == nil && len(got) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("List after the holder was killed = %v, %v; want none", got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A process never spends more than Limit descriptors on marks.
func TestHoldStopsAtLimit(t *testing.T) {
	if !Supported() {
		t.Skip("no abstract unix namespace on this system")
	}
	ns := Namespace(t.TempDir())
	defer DropAll(ns)
	n := Limit()
	if n <= 0 || n > 4096 {
		t.Fatalf("Limit() = %d; want 1 to 4096", n)
	}
	for i := range n {
		m := Mark{Protocol: "tcp", Addr: netip.MustParseAddr("127.0.0.1"), Port: uint16(1 + i), PID: os.Getpid()}
		if _, err := Hold(ns, m); err != nil {
			t.Fatalf("Hold of mark %d of %d: %v", i+1, n, err)
		}
	}
	extra := Mark{Protocol: "udp", Addr: netip.MustParseAddr("127.0.0.1"), Port: 1, PID: os.Getpid()}
	if _, err := Hold(ns, extra); !errors.Is(err, ErrTooMany) {
		t.Fatalf("Hold past the limit = %v; want ErrTooMany", err)
	}
	if got, err := List(ns); err != nil || len(got) != n {
		t.Fatalf("List = %d marks, %v; want %d", len(got), err, n)
	}
}

// TestListUnderChurn: List finds every mark held throughout, while other
// marks are made and dropped as fast as two goroutines can (one read of
// the kernel's table misses such a mark now and then; see List).
func TestListUnderChurn(t *testing.T) {
	if !Supported() {
		t.Skip("no abstract unix namespace on this system")
	}
	ns, other := Namespace(t.TempDir()), Namespace(t.TempDir())
	defer DropAll(ns)
	held := map[Mark]bool{}
	for i := range 200 {
		m := Mark{Protocol: "tcp", Addr: netip.MustParseAddr("127.0.0.1"), Port: uint16(20000 + i), PID: os.Getpid(), Start: 1}
		if _, err := Hold(ns, m); err != nil {
			t.Fatal(err)
		}
		held[m] = true
	}
	stop := make(chan struct{})
	done := make(chan struct{}, 2)
	for g := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var churn []Mark
				for k := range 50 {
					m := Mark{Protocol: "udp", Addr: netip.MustParseAddr("::1"), Port: uint16(1 + k), PID: g + 1, Start: int64(i)}
					if _, err := Hold(other, m); err == nil {
						churn = append(churn, m)
					}
				}
				for _, m := range churn {
					Drop(other, m)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		<-done
		<-done
		DropAll(other)
	}()
	for i := range 150 {
		got, err := List(ns)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, m := range got {
			if held[m] {
				found++
			}
		}
		if found != len(held) {
			t.Fatalf("List %d found %d of the %d marks held throughout", i+1, found, len(held))
		}
	}
}
