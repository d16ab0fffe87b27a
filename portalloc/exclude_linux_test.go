package portalloc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// TestLocalReservedPortsNeverHandedOut: with four ports of a twelve-port
// range in net.ipv4.ip_local_reserved_ports, Allocate hands out the other
// eight and then runs out; Reserve and Prefer of a reserved port are
// refused with a *FieldError that names the sysctl, unless the request
// allows it.
func TestLocalReservedPortsNeverHandedOut(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 12)
	reserved := store.Range{First: base + 4, Last: base + 7}
	testports.SetLocalReserved(t, reserved.String())

	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: store.Range{First: base, Last: base + 11}, AllowEphemeralOverlap: true})
	n := 0
	for {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if errors.Is(err, store.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if reserved.Contains(r.Port) {
			t.Errorf("Allocate handed out %d, which net.ipv4.ip_local_reserved_ports (%v) reserves", r.Port, reserved)
		}
		n++
	}
	if n != 8 {
		t.Errorf("Allocate handed out %d ports of 12 with 4 reserved; want 8", n)
	}

	_, err := a.Reserve(ctx, portalloc.Request{}, reserved.First)
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "port" || !strings.Contains(err.Error(), "net.ipv4.ip_local_reserved_ports ("+reserved.String()+")") || !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Reserve(%d) = %v; want a *FieldError for port that names net.ipv4.ip_local_reserved_ports and %v", reserved.First, err, reserved)
	}
	_, err = a.Allocate(ctx, portalloc.Request{Prefer: []uint16{reserved.Last}})
	if !errors.As(err, &fe) || fe.Field != "Request.Prefer[0]" {
		t.Errorf("Allocate(Prefer %d) = %v; want a *FieldError for Request.Prefer[0]", reserved.Last, err)
	}

	r, err := a.Reserve(ctx, portalloc.Request{AllowOSReserved: true}, reserved.First)
	if err != nil || r.Port != reserved.First {
		t.Errorf("Reserve(%d) with AllowOSReserved = %v, %v; want it reserved", reserved.First, r.Port, err)
	}
	r, err = a.Allocate(ctx, portalloc.Request{Prefer: []uint16{reserved.Last}, AllowOSReserved: true})
	if err != nil || r.Port != reserved.Last {
		t.Errorf("Allocate(Prefer %d) with AllowOSReserved = %v, %v; want %d", reserved.Last, r.Port, err, reserved.Last)
	}
}
