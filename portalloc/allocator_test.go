package portalloc_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// TestConcurrentAllocate: 50 goroutines allocate 20 ports each from one
// Allocator; all 1,000 are distinct, in range, bindable, and rows of the
// store.
func TestConcurrentAllocate(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	var (
		mu  sync.Mutex
		got []store.Reservation
		wg  sync.WaitGroup
	)
	for range 50 {
		wg.Go(func() {
			for range 20 {
				r, err := a.Allocate(context.Background(), portalloc.Request{Label: "load"})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(got) != 1000 {
		t.Fatalf("%d allocations; want 1000", len(got))
	}
	seen := map[uint16]bool{}
	for _, r := range got {
		if seen[r.Port] {
			t.Fatalf("port %d handed out twice", r.Port)
		}
		seen[r.Port] = true
		if !allocRange.Contains(r.Port) || r.Kind != store.Dynamic || r.Label != "load" {
			t.Errorf("reservation %+v; want a dynamic port labelled load in %v", r, allocRange)
		}
		if !bindable(t, r) {
			t.Errorf("port %d is not bindable", r.Port)
		}
	}
	if rows := storeRows(t, a.Config().StateDir, store.Filter{Label: "load"}); len(rows) != 1000 {
		t.Errorf("the store has %d rows labelled load; want 1000", len(rows))
	}
	if n := len(a.Held()); n != 1000 {
		t.Errorf("Held() has %d reservations; want 1000", n)
	}
}

// TestForeignListenersSkipped: four of a five-port range are held by plain
// listeners outside berth; Allocate returns the fifth, then runs out.
func TestForeignListenersSkipped(t *testing.T) {
	base := freeRun(t, 5)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: store.Range{First: base, Last: base + 4}, AllowEphemeralOverlap: true})
	for p := base; p < base+4; p++ {
		defer mustListen(t, lo4, p).Close()
	}
	r, err := a.Allocate(context.Background(), portalloc.Request{})
	if err != nil || r.Port != base+4 {
		t.Fatalf("Allocate = %+v, %v; want port %d", r, err, base+4)
	}
	_, err = a.Allocate(context.Background(), portalloc.Request{})
	if !errors.Is(err, store.ErrExhausted) {
		t.Fatalf("second Allocate = %v; want ErrExhausted", err)
	}
	if !strings.Contains(err.Error(), strconv.Itoa(int(base))) {
		t.Errorf("error %q does not name the range", err)
	}
	if st := a.Stats(); st.ProbeFailures < 4 {
		t.Errorf("Stats().ProbeFailures = %d; want the 4 bound ports counted", st.ProbeFailures)
	}
}

// TestWildcardsThroughAPI: another process holds 0.0.0.0:p. 127.0.0.1:p and
// :::p are refused with a message naming the holder. So is [::1]:p: Go
// binds 0.0.0.0 as a dual-stack socket, and Linux refuses an IPv6 socket that
// is not V6ONLY beside an IPv4 wildcard, so the two could not both bind (see
// package store's conflict rule). A specific IPv6 address beside a specific
// IPv4 address is fine.
func TestWildcardsThroughAPI(t *testing.T) {
	dir := t.TempDir()
	port := freeRun(t, 1)
	pid := holdInWorker(t, dir, any4, port).cmd.Process.Pid
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	for _, addr := range []netip.Addr{lo4, any6, lo6, any4} {
		_, err := a.Reserve(context.Background(), portalloc.Request{Addr: addr}, port)
		var ce *store.ConflictError
		if !errors.Is(err, store.ErrHeld) || !errors.As(err, &ce) {
			t.Fatalf("Reserve(%s:%d) = %v; want ErrHeld", addr, port, err)
		}
		if ce.Holder.Owner.PID != pid || ce.Self || ce.Holder.Addr != any4 {
			t.Errorf("conflict = %+v; want holder pid %d on 0.0.0.0", ce, pid)
		}
		if want := "held by pid " + strconv.Itoa(pid); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "worker") {
			t.Errorf("error %q does not say who holds it (%q, label worker)", err, want)
		}
	}

	other := freeRun(t, 1)
	for other == port { // bindable, but reserved in the store by the first worker
		other = freeRun(t, 1)
	}
	holdInWorker(t, dir, lo4, other)
	if _, err := a.Reserve(context.Background(), portalloc.Request{Addr: lo6}, other); err != nil {
		if strings.Contains(err.Error(), "cannot assign") || strings.Contains(err.Error(), "want an address of this host") {
			t.Skipf("no IPv6 loopback on this host: %v", err)
		}
		t.Errorf("Reserve([::1]:%d) beside 127.0.0.1:%d = %v; want success", other, other, err)
	}
}

// TestOwnWildcardMessage: the holder is this process itself.
func TestOwnWildcardMessage(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	r, err := a.Allocate(context.Background(), portalloc.Request{Addr: any4, Label: "proxy"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Reserve(context.Background(), portalloc.Request{}, r.Port)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Self {
		t.Fatalf("Reserve under own wildcard = %v; want a ConflictError with Self", err)
	}
	if !strings.Contains(err.Error(), "this process's own reservation of tcp 0.0.0.0:") {
		t.Errorf("error %q does not say the holder is this process's own wildcard", err)
	}
	// The exact same key again is not a conflict: it is the same reservation.
	again, err := a.Reserve(context.Background(), portalloc.Request{Addr: any4}, r.Port)
	if err != nil || again.Port != r.Port || again.Label != "proxy" {
		t.Errorf("Reserve of own exact key = %+v, %v; want it back", again, err)
	}
}

// TestCloseReleases: after Close another Allocator can reserve the same
// ports, the closed one refuses calls, and a second Close is nil.
func TestCloseReleases(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange, IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	var rs []store.Reservation
	for range 3 {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	static, err := a.Reserve(ctx, portalloc.Request{Protocol: store.UDP}, freeRun(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	rs = append(rs, static)
	if len(a.Held()) != 4 {
		t.Errorf("Held() = %d; want 4", len(a.Held()))
	}

	// b runs in this process too, so it is the same owner: reserving a's
	// exact keys would just return a's rows. The wildcard of each port
	// conflicts with any row left on it, whoever owns it.
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	if _, err := b.Reserve(ctx, portalloc.Request{Addr: any4}, rs[0].Port); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("Reserve of a held port = %v; want ErrHeld", err)
	}
	select {
	case <-a.Done():
		t.Fatal("Done() is closed before Close")
	default:
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	default:
		t.Error("Done() is not closed after Close")
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if h := a.Held(); len(h) != 0 {
		t.Errorf("Held() after Close = %v; want none", h)
	}
	for _, r := range rs {
		if _, err := b.Reserve(ctx, portalloc.Request{Protocol: r.Protocol, Addr: any4}, r.Port); err != nil {
			t.Errorf("Reserve(%s) after the holder closed = %v", r, err)
		}
	}
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Allocate after Close = %v; want ErrClosed", err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, allocRange.First); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Reserve after Close = %v; want ErrClosed", err)
	}
	if err := a.Transfer(ctx, rs[0], os.Getpid()); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Transfer after Close = %v; want ErrClosed", err)
	}
}

// TestRelease: releasing twice, or something never reserved, returns an
// error for logging and changes nothing else.
func TestRelease(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil {
		t.Fatal(err)
	}
	keep, err := a.Allocate(ctx, portalloc.Request{Label: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, r); err != nil {
		t.Errorf("Release = %v", err)
	}
	if rows := storeRows(t, a.Config().StateDir, store.Filter{Port: r.Port}); len(rows) != 0 {
		t.Errorf("rows of port %d after Release = %v; want none", r.Port, rows)
	}
	// Releasing what is released already is ErrNotFound, said once, in
	// portalloc's words.
	err = a.Release(ctx, r)
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second Release = %v; want ErrNotFound", err)
	} else if msg := err.Error(); strings.Count(msg, r.String()) != 1 || strings.Count(msg, "portalloc: ") != 1 || !strings.HasPrefix(msg, "portalloc: release ") {
		t.Errorf("second Release says %q; want one prefix naming the reservation once", msg)
	}
	if err := a.Release(ctx, store.Reservation{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Release(zero) = %v; want ErrInvalid", err)
	}
	if h := a.Held(); len(h) != 1 || h[0] != keep {
		t.Errorf("Held() = %v; want only %v", h, keep)
	}
}

func TestContextAndTimeout(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Allocate(cancelled) = %v; want context.Canceled", err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, allocRange.First); !errors.Is(err, context.Canceled) {
		t.Errorf("Reserve(cancelled) = %v; want context.Canceled", err)
	}
	if h := a.Held(); len(h) != 0 {
		t.Errorf("Held() after cancelled calls = %v; want none", h)
	}

	// Timeout bounds New's opening of the store as well.
	_, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Timeout: time.Nanosecond, IgnoreEnv: true})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("New with a spent Timeout = %v; want ErrUnavailable and DeadlineExceeded", err)
	}
}

// TestBadInput: each bad value is a clear error wrapping ErrInvalid, and
// nothing is reserved or written.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	ctx := context.Background()
	type check struct {
		name string
		err  error
		want string
	}
	var checks []check
	_, err := a.Reserve(ctx, portalloc.Request{}, 0)
	checks = append(checks, check{"Reserve(0)", err, `port "0"`})
	_, err = a.Allocate(ctx, portalloc.Request{Addr: netip.MustParseAddr("fe80::1%lo")})
	checks = append(checks, check{"zoned", err, "zone"})
	_, err = a.Allocate(ctx, portalloc.Request{Protocol: "sctp"})
	checks = append(checks, check{"sctp", err, `"tcp" or "udp"`})
	_, err = a.Allocate(ctx, portalloc.Request{Addr: netip.MustParseAddr("192.0.2.1")})
	checks = append(checks, check{"foreign address", err, `Request.Addr "192.0.2.1": want an address of this host`})
	for _, c := range checks {
		if !errors.Is(c.err, store.ErrInvalid) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error = %v; want ErrInvalid saying %q", c.name, c.err, c.want)
		}
	}
	if h := a.Held(); len(h) != 0 {
		t.Errorf("Held() after bad requests = %v; want none", h)
	}
	if rows := storeRows(t, dir, store.Filter{}); len(rows) != 0 {
		t.Errorf("rows after bad requests = %v; want none", rows)
	}

	fresh := filepath.Join(t.TempDir(), "never")
	for _, cfg := range []portalloc.Config{
		{StateDir: fresh, Mode: "turbo"},
		{StateDir: fresh, Range: store.Range{First: 30000, Last: 20000}},
		{StateDir: fresh, Range: store.Range{First: 0, Last: 10}},
		{StateDir: fresh, Range: store.Range{First: 1, Last: 10}}, // privileged, not allowed
		{StateDir: fresh, Exclude: []store.Range{{First: 5, Last: 1}}},
		{StateDir: fresh, Timeout: -time.Second},
		{StateDir: fresh, Order: "up"},
		{StateDir: fresh, Range: store.Range{First: 40000, Last: 40010}}, // inside the Linux ephemeral range
	} {
		if cfg.Range.First == 40000 {
			if eph := ephemeralRange(t); !eph.Contains(40000) || !eph.Contains(40010) {
				continue
			}
		}
		cfg.IgnoreEnv = true
		a, err := portalloc.New(ctx, cfg)
		if err == nil {
			_ = a.Close()
		}
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("New(%+v) = %v; want ErrInvalid", cfg, err)
		}
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("a rejected configuration created %s", fresh)
	}
}

// TestTransfer: a reservation handed to another process is that process's
// in the store and no longer this Allocator's; one handed to no running
// process stays this Allocator's, and one it does not hold is not found.
func TestTransfer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	r, err := a.Allocate(ctx, portalloc.Request{Label: "child"})
	if err != nil {
		t.Fatal(err)
	}
	// A worker process stands in for the child; it holds another port.
	pid := holdInWorker(t, dir, lo4, freeRun(t, 1)).cmd.Process.Pid
	if err := a.Transfer(ctx, r, pid); err != nil {
		t.Fatal(err)
	}
	if len(a.Held()) != 0 {
		t.Errorf("Held() after Transfer = %v; want none", a.Held())
	}
	_, err = a.Reserve(ctx, portalloc.Request{}, r.Port)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != pid || ce.Holder.Label != "child" {
		t.Errorf("Reserve after Transfer = %v; want held by pid %d, label child", err, pid)
	}
	if err := a.Transfer(ctx, r, pid); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Transfer of a reservation handed over already = %v; want ErrNotFound", err)
	}
	if err := a.Release(ctx, r); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release of a reservation handed over = %v; want ErrNotFound", err)
	}

	kept, err := a.Allocate(ctx, portalloc.Request{Label: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	var fe *store.FieldError
	if err := a.Transfer(ctx, kept, 1<<30); !errors.As(err, &fe) || fe.Field != "pid" {
		t.Errorf("Transfer to a pid that does not run = %v; want a *FieldError for pid", err)
	}
	if h := a.Held(); len(h) != 1 || h[0] != kept {
		t.Errorf("Held() after a refused Transfer = %v; want %v still", h, kept)
	}
	if rows := storeRows(t, dir, store.Filter{Port: kept.Port}); len(rows) != 1 || rows[0].Owner.PID != os.Getpid() {
		t.Errorf("rows of port %d after a refused Transfer = %v; want this process's", kept.Port, rows)
	}
}

// TestFilesOfReservations: Files gives copies of the lock of a reservation
// this Allocator holds, and refuses one it does not.
func TestFilesOfReservations(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil {
		t.Fatal(err)
	}
	files, err := a.Files(r)
	if err != nil || len(files) == 0 {
		t.Fatalf("Files(%v) = %v, %v; want the descriptors of its lock", r, files, err)
	}
	for _, f := range files {
		_ = f.Close()
	}
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: a.Config().StateDir})
	if _, err := b.Files(r); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Files of another Allocator's reservation = %v; want ErrNotFound", err)
	}
	if err := a.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	if files, err := a.Files(r); !errors.Is(err, store.ErrNotFound) || !strings.HasPrefix(err.Error(), "portalloc: files of ") {
		t.Errorf("Files of a released reservation = %v, %v; want ErrNotFound", files, err)
	}
}

// TestHeldAcrossAllocators: each Allocator of a process lists what it
// holds, a port both hold once each; a Reserve of a port the process holds
// takes one more hold, released one at a time.
func TestHeldAcrossAllocators(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: a.Config().StateDir})
	ra, err := a.Allocate(ctx, portalloc.Request{Label: "a"})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Reserve(ctx, portalloc.Request{}, ra.Port)
	if err != nil || rb != ra {
		t.Fatalf("b.Reserve of a's port = %+v, %v; want a's reservation %+v", rb, err, ra)
	}
	again, err := a.Reserve(ctx, portalloc.Request{}, ra.Port)
	if err != nil || again != ra {
		t.Fatalf("a.Reserve of its own port = %+v, %v; want it back", again, err)
	}
	for name, x := range map[string]*portalloc.Allocator{"a": a, "b": b} {
		if h := x.Held(); len(h) != 1 || h[0] != ra {
			t.Errorf("%s.Held() = %v; want %v once", name, h, ra)
		}
	}
	if st := a.Stats(); st.Held != 1 {
		t.Errorf("a.Stats().Held = %d; want 1", st.Held)
	}
	// a holds it twice: one Release leaves it a's.
	if err := a.Release(ctx, ra); err != nil {
		t.Fatal(err)
	}
	if !holdsPort(a, ra.Port) {
		t.Errorf("a.Held() after one of its two holds was released = %v; want port %d", a.Held(), ra.Port)
	}
	for _, x := range []*portalloc.Allocator{a, b} {
		if err := x.Release(ctx, ra); err != nil {
			t.Fatal(err)
		}
	}
	if rows := storeRows(t, a.Config().StateDir, store.Filter{Port: ra.Port}); len(rows) != 0 {
		t.Errorf("rows of port %d after every hold was released = %v; want none", ra.Port, rows)
	}
}
