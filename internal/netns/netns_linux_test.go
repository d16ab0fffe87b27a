package netns_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/internal/testproc"
)

// TestMain runs the binary as a child that binds in its namespace when a
// test started it as one.
func TestMain(m *testing.M) {
	if addr := os.Getenv("BERTH_NETNS_TEST_BIND"); addr != "" {
		os.Exit(bindAndHold(addr))
	}
	os.Exit(m.Run())
}

// bindAndHold listens on addr, proves the loopback is up by connecting to
// it, says "bound", and holds the port until stdin closes.
func bindAndHold(addr string) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	_ = c.Close()
	fmt.Println("bound")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// TestPortSpaces: one port, bound on the host, is bound again at the same
// time in each of two namespaces, whose loopbacks are up.
func TestPortSpaces(t *testing.T) {
	nss := netns.ForTest(t, 2)
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	addr := host.Addr().String()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss {
		cmd := ns.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), "BERTH_NETNS_TEST_BIND="+addr)
		stdin, stdout := testproc.Start(t, cmd)
		defer func() { _ = stdin.Close(); _ = cmd.Wait() }() // holds the port until the test ends
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		if got := strings.TrimSpace(line); got != "bound" {
			t.Errorf("binding %s in %s: %q; want bound", addr, ns.Name, got)
		}
	}
}

// TestRemoved: the namespaces ForTest made are gone once the test that
// made them has ended.
func TestRemoved(t *testing.T) {
	var names []string
	t.Run("make", func(t *testing.T) {
		for _, ns := range netns.ForTest(t, 2) {
			names = append(names, ns.Name)
		}
	})
	if len(names) == 0 {
		t.Skip("no namespaces were made")
	}
	for _, name := range names {
		if _, err := os.Stat("/run/netns/" + name); !os.IsNotExist(err) {
			t.Errorf("namespace %s still there after its test (%v)", name, err)
		}
	}
}

// TestDo: one process binds one port in the root namespace and, through
// Do, in each of two namespaces at once; its own namespace is unchanged
// afterwards.
func TestDo(t *testing.T) {
	nss := netns.ForTest(t, 2)
	before, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	addr := host.Addr().String()
	for _, ns := range nss {
		var l net.Listener
		if err := ns.Do(func() (err error) {
			l, err = net.Listen("tcp", addr)
			return err
		}); err != nil {
			t.Fatalf("bind %s in %s: %v", addr, ns.Name, err)
		}
		defer l.Close()
		// A second bind in the same namespace fails: the socket is there.
		if err := ns.Do(func() error {
			l2, err := net.Listen("tcp", addr)
			if err == nil {
				_ = l2.Close()
				return fmt.Errorf("bound %s twice in one namespace", addr)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	if after, _ := os.Readlink("/proc/self/ns/net"); after != before {
		t.Errorf("this process's network namespace after Do = %s; want %s", after, before)
	}
}

// TestPids: a process started in a namespace is listed there, and not in
// another.
func TestPids(t *testing.T) {
	nss := netns.ForTest(t, 2)
	cmd := nss[0].Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids, err := nss[0].Pids(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(pids, cmd.Process.Pid) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Pids of %s = %v; want it to list %d", nss[0].Name, pids, cmd.Process.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pids, err := nss[1].Pids(ctx); err != nil || slices.Contains(pids, cmd.Process.Pid) {
		t.Errorf("Pids of %s = %v, %v; want no %d", nss[1].Name, pids, err, cmd.Process.Pid)
	}
}

// TestKillAll: every process of a namespace, a child started there and
// its own child, is killed, and none of another namespace.
func TestKillAll(t *testing.T) {
	nss := netns.ForTest(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	victim := nss[0].Command("sh", "-c", "sleep 30 & sleep 30; true")
	other := nss[1].Command("sleep", "30")
	for _, c := range []*exec.Cmd{victim, other} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	waited := make(chan error, 1)
	go func() { waited <- victim.Wait() }()
	for { // until the shell has started its child
		pids, err := nss[0].Pids(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) >= 3 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	n, err := nss[0].KillAll(ctx, nil)
	if err != nil || n < 3 {
		t.Errorf("KillAll = %d, %v; want the shell and its two sleeps", n, err)
	}
	<-waited
	if pids, err := nss[0].Pids(ctx); err != nil || len(pids) != 0 {
		t.Errorf("Pids after KillAll = %v, %v; want none", pids, err)
	}
	if pids, err := nss[1].Pids(ctx); err != nil || !slices.Contains(pids, other.Process.Pid) {
		t.Errorf("Pids of the other namespace after KillAll = %v, %v; want %d still there", pids, err, other.Process.Pid)
	}
}
