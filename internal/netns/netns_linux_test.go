package netns_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/netns"
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
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
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
