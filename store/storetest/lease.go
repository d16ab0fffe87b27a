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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h1, h2 := store.Owner{Holder: "h1"}, store.Owner{Holder: "h2"}
	k := key(store.TCP, "127.0.0.1", 40500)
	r, err := s.Reserve(ctx, store.Request{Key: k, Owner: h1, TTL: time.Hour, Label: "l"})
	var fe *store.FieldError
	if errors.As(err, &fe) && fe.Field == "owner" {
		t.Skipf("%T keeps no named holders of one host: %v", s, err)
	}
	if err != nil {
		t.Fatalf("Reserve(%v) for holder h1 = %v", k, err)
	}
	if r.Owner.Holder != "h1" || time.Until(r.Expires) < 59*time.Minute {
		t.Errorf("Reserve(%v) for h1 = %+v; want holder h1, ending in about an hour", k, r)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: k, Owner: h1, TTL: time.Hour, Label: "l"}); err != nil {
		t.Errorf("Reserve(%v) again by its holder = %v; want its row", k, err)
	}
	var ce *store.ConflictError
	if _, err := s.Reserve(ctx, store.Request{Key: k}); !errors.As(err, &ce) || ce.Holder.Owner.Holder != "h1" {
		t.Errorf("Reserve(%v) of a process, held by h1 = %v; want a ConflictError naming h1", k, err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: k, Owner: h2, TTL: time.Hour}); !errors.Is(err, store.ErrHeld) {
		t.Errorf("Reserve(%v) of another holder = %v; want ErrHeld", k, err)
	}
	if n, err := s.Reap(ctx); err != nil || n != 0 {
		t.Errorf("Reap with a live lease = %d, %v; want 0", n, err)
	}
	got, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: k.Addr, Next: Candidates(40500, 40501), Owner: h2, TTL: time.Hour})
	if err != nil || got.Port != 40501 {
		t.Errorf("Scan(40500, 40501) for h2 = %v, %v; want 40501", got.Port, err)
	}
	if n, err := s.Renew(ctx, "h1", 2*time.Hour); err != nil || n != 1 {
		t.Errorf("Renew(h1) = %d, %v; want 1", n, err)
	}
	if _, err := s.Renew(ctx, "nobody", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew(nobody) = %v; want ErrNotFound", err)
	}
	if rows, err := s.List(ctx, store.Filter{Holder: "h1"}); err != nil || len(rows) != 1 || rows[0].Key != k {
		t.Errorf("List(holder h1) = %+v, %v; want its row of %v", rows, err, k)
	}

	// A lease of a second ends and is reaped; it is never renewed.
	k3 := key(store.TCP, "127.0.0.1", 40502)
	mustReserve(ctx, t, s, store.Request{Key: k3, Owner: store.Owner{Holder: "h3"}, TTL: time.Second})
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
	if _, err := s.Renew(ctx, "h3", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew(h3) after its lease ended = %v; want ErrNotFound", err)
	}

	if err := s.Release(ctx, k, h2); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release(%v) by h2, h1's = %v; want ErrNotFound", k, err)
	}
	if err := s.Release(ctx, k, h1); err != nil {
		t.Errorf("Release(%v) by h1 = %v", k, err)
	}
	if err := s.Release(ctx, k, h1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release(%v) by h1 again = %v; want ErrNotFound", k, err)
	}
	rows, err := s.List(ctx, store.Filter{})
	if err != nil || len(rows) != 1 || rows[0].Port != 40501 || rows[0].Owner.Holder != "h2" {
		t.Errorf("List after the releases = %+v, %v; want h2's 40501 alone", rows, err)
	}
}
