package statestore_test

import (
	"context"
	"errors"
	"os/exec"
	"testing"

	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// TestScanBlock: a block is n consecutive ports, all free of live holders
// and all passing the probe, reserved together; a base with any port taken
// is passed over, and a dead owner's row in the way is reaped.
func TestScanBlock(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	idle := exec.Command("sleep", "3600")
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = idle.Process.Kill(); _ = idle.Wait() }()
	other, err := store.LookupOwner(ctx, idle.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 40011), Owner: other}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 40031), Owner: deadOwner(t, 0)}); err != nil {
		t.Fatal(err)
	}
	probe := func(k store.Key) error { // 40041 as if bound outside berth
		if k.Port == 40041 {
			return bound(k)
		}
		return nil
	}

	for _, tc := range []struct {
		next []uint16
		want uint16
	}{
		{[]uint16{40000}, 40000},        // an empty stretch
		{[]uint16{40010, 40020}, 40020}, // 40011 is held by a live process
		{[]uint16{40030}, 40030},        // 40031's owner is dead: reaped
		{[]uint16{40040, 40050}, 40050}, // 40041 fails the probe
	} {
		rs, err := s.ScanBlock(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Label: "block", Next: storetest.Candidates(tc.next...), Probe: probe}, 3)
		if err != nil {
			t.Fatalf("ScanBlock(%v): %v", tc.next, err)
		}
		if len(rs) != 3 {
			t.Fatalf("ScanBlock(%v) = %v; want 3 reservations", tc.next, rs)
		}
		for i, r := range rs {
			if r.Port != tc.want+uint16(i) || r.Label != "block" {
				t.Errorf("ScanBlock(%v)[%d] = %v; want port %d labelled block", tc.next, i, r, tc.want+uint16(i))
			}
		}
	}
	if got := s.Stats().Reaped; got != 1 {
		t.Errorf("Reaped = %d; want the dead owner's row", got)
	}

	before := len(list(t, s))
	// Every candidate's block has a taken port, or passes 65535: nothing
	// of any of them is reserved.
	_, err = s.ScanBlock(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: storetest.Candidates(40009, 40039, 65534), Probe: probe}, 3)
	if !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ScanBlock with no free block = %v; want ErrExhausted", err)
	}
	if after := len(list(t, s)); after != before {
		t.Errorf("%d rows after a failed block scan; want %d", after, before)
	}
	var fe *store.FieldError
	if _, err := s.ScanBlock(ctx, store.ScanRequest{Next: storetest.Candidates(40100)}, 0); !errors.As(err, &fe) {
		t.Errorf("ScanBlock of 0 ports = %v; want a FieldError", err)
	}
}
