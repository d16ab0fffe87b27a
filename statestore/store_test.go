package statestore_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

var (
	lo4  = netip.MustParseAddr("127.0.0.1")
	any4 = netip.MustParseAddr("0.0.0.0")
	lo6  = netip.MustParseAddr("::1")
	any6 = netip.MustParseAddr("::")
)

func tcp(a netip.Addr, port uint16) store.Key {
	return store.Key{Protocol: store.TCP, Addr: a, Port: port}
}

func isHeld(err error) bool { return errors.Is(err, store.ErrHeld) }

// open opens a store in a fresh temporary directory and closes it at the
// end of the test.
func open(tb testing.TB) (store.Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "state", "berth.db")
	return openAt(tb, path), path
}

func openAt(tb testing.TB, path string) store.Store {
	tb.Helper()
	s, err := statestore.Open(context.Background(), path, statestore.Options{SweepInterval: -1})
	if err != nil {
		tb.Fatalf("Open(%s): %v", path, err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

func list(tb testing.TB, s store.Store) []store.Reservation {
	tb.Helper()
	rs, err := s.List(context.Background(), store.Filter{})
	if err != nil {
		tb.Fatal(err)
	}
	return rs
}

// deadOwner returns an identity that no running process has: this process's
// pid with another start, which is exactly what a reused pid looks like.
// Each shift gives another owner; starts are compared exactly, so any
// difference will do.
func deadOwner(tb testing.TB, shift time.Duration) store.Owner {
	tb.Helper()
	me, err := store.Self()
	if err != nil {
		tb.Fatal(err)
	}
	me.Start -= 1 + shift.Milliseconds()
	return me
}

func TestOpenCreatesPrivateFiles(t *testing.T) {
	_, path := open(t)
	for p, want := range map[string]os.FileMode{filepath.Dir(path): 0o700, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("mode of %s = %v; want %v", p, got, want)
		}
	}
}

func TestReserveReleaseList(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	r, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 21000), Label: "api.http"})
	if err != nil {
		t.Fatal(err)
	}
	me, _ := store.Self()
	if r.Key != tcp(lo4, 21000) || !r.Owner.Same(me) || r.Kind != store.Static || r.Label != "api.http" {
		t.Errorf("Reserve = %+v; want tcp 127.0.0.1:21000 static api.http owned by this process", r)
	}
	// The same owner asking again gets the same row back.
	again, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 21000), Label: "other"})
	if err != nil || again.Label != "api.http" || !again.Created.Equal(r.Created) {
		t.Errorf("Reserve again = %+v, %v; want the existing row", again, err)
	}
	// Another protocol and another address are other keys.
	if _, err := s.Reserve(ctx, store.Request{Key: store.Key{Protocol: store.UDP, Addr: lo4, Port: 21000}}); err != nil {
		t.Errorf("Reserve(udp, same port) = %v; want success", err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo6, 21000)}); err != nil {
		t.Errorf("Reserve(::1, same port) = %v; want success", err)
	}
	rs := list(t, s)
	if len(rs) != 3 {
		t.Fatalf("List = %d rows; want 3", len(rs))
	}
	rs, _ = s.List(ctx, store.Filter{Label: "api.http"})
	if len(rs) != 1 || rs[0].Port != 21000 {
		t.Errorf("List(label api.http) = %+v; want the one row", rs)
	}
	if err := s.Release(ctx, tcp(lo4, 21000), store.Owner{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, tcp(lo4, 21000), store.Owner{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second Release error = %v; want ErrNotFound", err)
	}
	mine, err := s.List(ctx, store.Filter{OwnerPID: os.Getpid()})
	if err != nil || len(mine) != 2 {
		t.Fatalf("List(this pid) = %+v, %v; want the two rows left", mine, err)
	}
	for _, r := range mine {
		if err := s.Release(ctx, r.Key, store.Owner{}); err != nil {
			t.Errorf("Release(%s) = %v", r.Key, err)
		}
	}
	if rs := list(t, s); len(rs) != 0 {
		t.Errorf("List after release = %+v; want none", rs)
	}
}

func TestConflictRule(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	other := startWorker(t, "hold", filepath.Join(t.TempDir(), "unused.db"), "BERTH_TEST_PORTS=[]")
	child, err := store.LookupOwner(ctx, other.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(any4, 22000), Owner: child}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{lo4, any4, any6, lo6} {
		_, err := s.Reserve(ctx, store.Request{Key: tcp(a, 22000)})
		var ce *store.ConflictError
		if !errors.As(err, &ce) || !isHeld(err) {
			t.Fatalf("Reserve(%s:22000) with 0.0.0.0 held = %v; want *ConflictError", a, err)
		}
		if ce.Self || ce.Holder.Owner.PID != child.PID {
			t.Errorf("conflict holder = %+v self=%v; want pid %d", ce.Holder.Owner, ce.Self, child.PID)
		}
		if !strings.Contains(err.Error(), "pid "+itoa(child.PID)) {
			t.Errorf("error %q does not name the holder's pid", err)
		}
	}
	// A different port is free.
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 22001)}); err != nil {
		t.Errorf("Reserve(other port) = %v", err)
	}
}

func TestConflictWithOwnWildcard(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(any6, 22100), Label: "proxy"}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 22100)})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Self {
		t.Fatalf("Reserve under own wildcard = %v; want *ConflictError with Self", err)
	}
	if !strings.Contains(err.Error(), "this process's own reservation of tcp [::]:22100") {
		t.Errorf("error %q does not say the holder is this process's own wildcard", err)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	me, _ := store.Self()
	tests := []struct {
		name  string
		req   store.Request
		field string
	}{
		{"protocol", store.Request{Key: store.Key{Protocol: "sctp", Addr: lo4, Port: 1000}}, "protocol"},
		{"empty protocol", store.Request{Key: store.Key{Addr: lo4, Port: 1000}}, "protocol"},
		{"port 0", store.Request{Key: tcp(lo4, 0)}, "port"},
		{"zoned", store.Request{Key: tcp(netip.MustParseAddr("fe80::1%eth0"), 1000)}, "address"},
		{"no address", store.Request{Key: tcp(netip.Addr{}, 1000)}, "address"},
		{"owner without start", store.Request{Key: tcp(lo4, 1000), Owner: store.Owner{PID: me.PID}}, "owner"},
		{"owner without pid", store.Request{Key: tcp(lo4, 1000), Owner: store.Owner{Start: me.Start}}, "owner"},
		{"kind", store.Request{Key: tcp(lo4, 1000), Kind: "sometimes"}, "kind"},
	}
	for _, tt := range tests {
		_, err := s.Reserve(ctx, tt.req)
		var fe *store.FieldError
		if !errors.As(err, &fe) || !errors.Is(err, store.ErrInvalid) || fe.Field != tt.field {
			t.Errorf("%s: Reserve error = %v; want *FieldError for %q", tt.name, err, tt.field)
			continue
		}
		if fe.Want == "" || !strings.Contains(err.Error(), "want") {
			t.Errorf("%s: error %q does not say what is accepted", tt.name, err)
		}
	}
	if rs := list(t, s); len(rs) != 0 {
		t.Errorf("rows after bad requests = %+v; want none", rs)
	}
}

// TestPidReuse: a row whose pid is this live process but whose start time
// is another is a dead owner's row, and gives way.
func TestPidReuse(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	ghost := deadOwner(t, 0)
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 23000), Owner: ghost}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 23000)})
	if err != nil {
		t.Fatalf("Reserve over reused pid's row = %v; want success", err)
	}
	me, _ := store.Self()
	if !r.Owner.Same(me) {
		t.Errorf("owner = %v; want this process", r.Owner)
	}
	if got := s.Stats().Reaped; got != 1 {
		t.Errorf("Stats().Reaped = %d; want 1", got)
	}
}

func TestTransferAndReap(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	w := startWorker(t, "hold", filepath.Join(t.TempDir(), "unused.db"), "BERTH_TEST_PORTS=[]")
	w.until(t, "done")
	child, err := store.LookupOwner(ctx, w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	key := tcp(lo4, 24000)
	if _, err := s.Reserve(ctx, store.Request{Key: key, Label: "svc"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Transfer(ctx, key, store.Owner{}, child); err != nil {
		t.Fatal(err)
	}
	// The parent no longer owns it: it can neither release it nor take it.
	if err := s.Release(ctx, key, store.Owner{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release after Transfer = %v; want ErrNotFound", err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: key}); !isHeld(err) {
		t.Errorf("Reserve of transferred key = %v; want ErrHeld", err)
	}
	if n, err := s.Reap(ctx); err != nil || n != 0 {
		t.Errorf("Reap with the child alive = %d, %v; want 0", n, err)
	}
	w.kill(t)
	if n, err := s.Reap(ctx); err != nil || n != 1 {
		t.Errorf("Reap after the child died = %d, %v; want 1", n, err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
		t.Errorf("Reserve after reaping = %v", err)
	}
	// Transfer to a process that does not run is refused.
	if err := s.Transfer(ctx, key, store.Owner{}, child); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Transfer to dead process = %v; want ErrInvalid", err)
	}
}

func TestScan(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	ports := func(ps ...uint16) func() (uint16, bool) {
		return func() (uint16, bool) {
			if len(ps) == 0 {
				return 0, false
			}
			p := ps[0]
			ps = ps[1:]
			return p, true
		}
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 25000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 25002), Owner: deadOwner(t, 0)}); err != nil {
		t.Fatal(err)
	}
	busy := map[uint16]bool{25001: true}
	probe := func(k store.Key) error {
		if busy[k.Port] {
			return bound(k)
		}
		return nil
	}
	// 25000 is ours, 25001 fails the probe, 25002 belongs to a dead owner.
	r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: ports(25000, 25001, 25002, 25003), Probe: probe})
	if err != nil || r.Port != 25002 || r.Kind != store.Dynamic {
		t.Fatalf("Scan = %+v, %v; want port 25002, dynamic", r, err)
	}
	if st := s.Stats(); st.Reaped != 1 || st.ProbeFailures != 1 {
		t.Errorf("Stats = %+v; want 1 reaped, 1 probe failure", st)
	}
	_, err = s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: ports(25000, 25001, 25002), Probe: probe})
	if !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Scan of held candidates = %v; want ErrExhausted", err)
	}
	// Small batches commit between candidates and still find the port.
	r, err = s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: ports(25001, 25001, 25001, 25004), Probe: probe, Batch: 1})
	if err != nil || r.Port != 25004 {
		t.Errorf("Scan with Batch 1 = %+v, %v; want 25004", r, err)
	}
}

func TestScanHonoursContext(t *testing.T) {
	s, _ := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	next := func() (uint16, bool) {
		calls++
		if calls == 10 {
			cancel()
		}
		return 26000, true // forever the same held port: only ctx ends this
	}
	if _, err := s.Reserve(context.Background(), store.Request{Key: tcp(lo4, 26000)}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Next: next})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Scan cancelled mid-way = %v; want context.Canceled", err)
	}
	// The store is usable afterwards: the transaction was rolled back.
	if _, err := s.Reserve(context.Background(), store.Request{Key: tcp(lo4, 26001)}); err != nil {
		t.Errorf("Reserve after cancelled scan = %v", err)
	}
}

func TestCloseIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := statestore.Open(context.Background(), path, statestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v; want nil", err)
	}
	if _, err := s.Reserve(context.Background(), store.Request{Key: tcp(lo4, 1000)}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Reserve after Close = %v; want ErrClosed", err)
	}
	if _, err := s.List(context.Background(), store.Filter{}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("List after Close = %v; want ErrClosed", err)
	}
}

// TestBackgroundSweep: Open starts a sweep that reaps dead owners' rows on
// its own, and Close stops it (goleak checks that in TestMain).
func TestBackgroundSweep(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	seed := openAt(t, path)
	for i := range 5 {
		if _, err := seed.Reserve(ctx, store.Request{Key: tcp(lo4, uint16(27000+i)), Owner: deadOwner(t, time.Duration(i)*time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Reaped < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("sweep reaped %d rows in 10s; want 5", s.Stats().Reaped)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rs := list(t, seed); len(rs) != 0 {
		t.Errorf("rows after sweep = %+v; want none", rs)
	}
}

// TestFirstSweepWaits checks that a store does not sweep the moment it
// opens, when a short-lived process is taking its first port, and does
// sweep once it has lived a second.
func TestFirstSweepWaits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	seed := openAt(t, path)
	for i := range 3 {
		if _, err := seed.Reserve(ctx, store.Request{Key: tcp(lo4, uint16(27100+i)), Owner: deadOwner(t, time.Duration(i)*time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	opened := time.Now()
	s, err := statestore.Open(ctx, path, statestore.Options{}) // the default interval: a minute
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 27200)}); err != nil {
		t.Fatal(err)
	}
	// A sweep at Open would be done well within 300 ms; the first one is
	// due at a second (a stalled machine that reads the counter later
	// proves nothing either way).
	time.Sleep(time.Until(opened.Add(300 * time.Millisecond)))
	if n := s.Stats().Reaped; n != 0 && time.Since(opened) < 900*time.Millisecond {
		t.Errorf("reaped %d rows %v after Open; want the sweep to wait a second", n, time.Since(opened).Round(time.Millisecond))
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Reaped < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("first sweep reaped %d rows in 10s; want 3", s.Stats().Reaped)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// bound is what a bind probe says of a port that a process outside berth
// has bound.
func bound(k store.Key) error { return &store.ConflictError{Key: k, Bound: true} }

func TestRememberRecall(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	if _, ok, err := s.Recall(ctx, "db", store.TCP); ok || err != nil {
		t.Fatalf("Recall before Remember = %v, %v; want nothing", ok, err)
	}
	if err := s.Remember(ctx, "db", store.TCP, 25432); err != nil {
		t.Fatal(err)
	}
	if err := s.Remember(ctx, "db", store.TCP, 25433); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s2 := openAt(t, path) // survives a restart
	if p, ok, err := s2.Recall(ctx, "db", store.TCP); !ok || err != nil || p != 25433 {
		t.Errorf("Recall = %d, %v, %v; want 25433", p, ok, err)
	}
	if _, ok, _ := s2.Recall(ctx, "db", store.UDP); ok {
		t.Error("Recall(udp) found the tcp port")
	}
	for _, bad := range []struct {
		label string
		proto store.Protocol
		port  uint16
	}{{"", store.TCP, 1}, {"x", "sctp", 1}, {"x", store.TCP, 0}} {
		if err := s2.Remember(ctx, bad.label, bad.proto, bad.port); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Remember(%q, %q, %d) = %v; want ErrInvalid", bad.label, bad.proto, bad.port, err)
		}
	}
}
