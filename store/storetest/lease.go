package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berth-go/berth/store"
)

// testLeases: a holder's reservation conflicts with every other owner's,
// survives Reap while its lease lasts, is renewed by its holder's name, ends
// on time and is reaped then (never renewed after), and is released by its
// holder's name.
func testLeases(t *testing.T, s store.Store) {
	ls, ok := s.(store.LeaseStore)
	if !ok {
		t.Skipf("%T keeps no leases of one host (store.LeaseStore)", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := key(store.TCP, "127.0.0.1", 40500)
	hour := store.Lease{Holder: "h1", TTL: time.Hour}
	r, err := ls.ReserveLease(ctx, store.Request{Key: k, Label: "l"}, hour)
	if err != nil {
		t.Fatalf("ReserveLease(%v) = %v", k, err)
	}
	if !r.Owner.IsLease() || r.Owner.Name != "h1" || time.Until(r.Expires) < 59*time.Minute {
		t.Errorf("ReserveLease(%v) = %+v; want holder h1, ending in about an hour", k, r)
	}
	if _, err := ls.ReserveLease(ctx, store.Request{Key: k, Label: "l"}, hour); err != nil {
		t.Errorf("ReserveLease(%v) again by its holder = %v; want its row", k, err)
	}
	var ce *store.ConflictError
	if _, err := s.Reserve(ctx, store.Request{Key: k}); !errors.As(err, &ce) || !ce.Holder.Owner.IsLease() || ce.Holder.Owner.Name != "h1" {
		t.Errorf("Reserve(%v) of a process, held by lease h1 = %v; want a ConflictError naming h1", k, err)
	}
	if _, err := ls.ReserveLease(ctx, store.Request{Key: k}, store.Lease{Holder: "h2", TTL: time.Hour}); !errors.Is(err, store.ErrHeld) {
		t.Errorf("ReserveLease(%v) of another holder = %v; want ErrHeld", k, err)
	}
	if n, err := s.Reap(ctx); err != nil || n != 0 {
		t.Errorf("Reap with a live lease = %d, %v; want 0", n, err)
	}
	got, err := ls.ScanLease(ctx, store.ScanRequest{Protocol: store.TCP, Addr: k.Addr, Next: Candidates(40500, 40501)}, store.Lease{Holder: "h2", TTL: time.Hour})
	if err != nil || got.Port != 40501 {
		t.Errorf("ScanLease(40500, 40501) for h2 = %v, %v; want 40501", got.Port, err)
	}
	if n, err := ls.RenewLease(ctx, "h1", 2*time.Hour); err != nil || n != 1 {
		t.Errorf("RenewLease(h1) = %d, %v; want 1", n, err)
	}
	if _, err := ls.RenewLease(ctx, "nobody", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RenewLease(nobody) = %v; want ErrNotFound", err)
	}

	// A lease of a second ends and is reaped; it is never renewed.
	k3 := key(store.TCP, "127.0.0.1", 40502)
	if _, err := ls.ReserveLease(ctx, store.Request{Key: k3}, store.Lease{Holder: "h3", TTL: time.Second}); err != nil {
		t.Fatalf("ReserveLease(%v) for a second = %v", k3, err)
	}
	start := time.Now()
	// Reaped by this Reap or by the store's own background sweep.
	for {
		if _, err := s.Reap(ctx); err != nil {
			t.Fatal(err)
		}
		rows, err := s.List(ctx, store.Filter{Port: k3.Port})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("a lease of a second was not reaped within 10s: %+v", rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(start); d < time.Second-100*time.Millisecond {
		t.Errorf("a lease of a second was reaped after %v", d)
	}
	if _, err := ls.RenewLease(ctx, "h3", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RenewLease(h3) after its lease ended = %v; want ErrNotFound", err)
	}

	if n, err := ls.ReleaseLease(ctx, "h1", store.Filter{}); err != nil || n != 1 {
		t.Errorf("ReleaseLease(h1) = %d, %v; want 1", n, err)
	}
	if _, err := ls.ReleaseLease(ctx, "h1", store.Filter{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReleaseLease(h1) again = %v; want ErrNotFound", err)
	}
	rows, err := s.List(ctx, store.Filter{})
	if err != nil || len(rows) != 1 || rows[0].Port != 40501 || rows[0].Owner.Name != "h2" {
		t.Errorf("List after the releases = %+v, %v; want h2's 40501 alone", rows, err)
	}
}
