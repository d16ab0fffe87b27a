package portlock_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"syscall"
	"testing"

	"github.com/berth-go/berth/portlock"
)

// TestProbeWhileForking probes ports while another goroutine starts
// processes without pause, and binds each port found free at once: a
// probe's socket copied into a child that is being started must not keep
// the port bound after Probe returns.
func TestProbeWhileForking(t *testing.T) {
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Skipf("skipping: no true program to start (%v)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_ = exec.Command(bin).Run()
		}
	}()
	defer wg.Wait()
	defer cancel()
	lo := netip.MustParseAddr("127.0.0.1")
	refused := 0
	for range 20000 {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
		_ = c.Close()
		free, err := portlock.Probe("udp", lo, port)
		if err != nil {
			t.Fatal(err)
		}
		if !free {
			continue // the listener's own copy in a starting child, say
		}
		c, err = net.ListenPacket("udp", netip.AddrPortFrom(lo, port).String())
		if errors.Is(err, syscall.EADDRINUSE) {
			refused++
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
	if refused > 0 {
		t.Errorf("%d ports probed free could not be bound right after the probe", refused)
	}
}
