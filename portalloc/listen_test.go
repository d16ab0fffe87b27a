package portalloc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// TestListen: Listen and ListenPacket return the port bound by the grant
// itself: a port bound outside berth is passed over, the socket returned
// is the one on the reserved key, and a range with nothing left is
// ErrExhausted with nothing left open or reserved.
func TestListen(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 3)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: store.Range{First: base, Last: base + 2}, AllowEphemeralOverlap: true, Order: portalloc.OrderLowest})
	defer mustListen(t, lo4, base).Close() // bound outside berth
	r, l, err := a.Listen(ctx, portalloc.Request{Label: "web"})
	if err != nil || r.Port != base+1 || r.Protocol != store.TCP {
		t.Fatalf("Listen = %v, %v; want tcp port %d, the first not bound", r, err, base+1)
	}
	defer l.Close()
	if l.Addr().String() != r.AddrPort().String() || bindable(t, r) {
		t.Errorf("Listen's listener is on %s, bound: %v; want it on %s, bound", l.Addr(), !bindable(t, r), r.AddrPort())
	}
	u, pc, err := a.ListenPacket(ctx, portalloc.Request{Label: "dns"})
	if err != nil || u.Protocol != store.UDP || pc.LocalAddr().String() != u.AddrPort().String() {
		t.Fatalf("ListenPacket = %v, %v; want a udp port bound", u, err)
	}
	defer pc.Close()
	if bindable(t, u) {
		t.Errorf("the udp port %d of ListenPacket is not bound", u.Port)
	}
	r2, l2, err := a.Listen(ctx, portalloc.Request{})
	if err != nil || r2.Port != base+2 {
		t.Fatalf("second Listen = %v, %v; want port %d", r2, err, base+2)
	}
	_ = l2.Close()
	if err := a.Release(ctx, r2); err != nil {
		t.Fatal(err)
	}
	// base+2 is free again, but bound outside berth now: nothing is left.
	defer mustListen(t, lo4, base+2).Close()
	before := len(a.Held())
	if r, l, err := a.Listen(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) || l != nil {
		t.Errorf("Listen with nothing left = %v, %v, %v; want ErrExhausted and no listener", r, l, err)
	}
	if after := len(a.Held()); after != before {
		t.Errorf("Held() has %d reservations after a failed Listen, %d before", after, before)
	}
}
