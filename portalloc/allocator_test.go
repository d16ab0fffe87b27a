package portalloc_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/testrig"
)

var (
	lo4  = netip.MustParseAddr("127.0.0.1")
	any4 = netip.MustParseAddr("0.0.0.0")
	lo6  = netip.MustParseAddr("::1")
	any6 = netip.MustParseAddr("::")
)

func listen(tb testing.TB, addr netip.Addr, port uint16) net.Listener {
	tb.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		tb.Fatalf("port %d is not bindable: %v", port, err)
	}
	return l
}

// TestConcurrentAllocate: 50 goroutines allocate 20 ports each from one
// Allocator; all 1,000 are distinct, in range and bindable.
func TestConcurrentAllocate(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	var (
		mu  sync.Mutex
		got []portalloc.Reservation
		wg  sync.WaitGroup
	)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
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
		if !allocRange.Contains(r.Port) || r.Backend != portalloc.BackendStateStore {
			t.Errorf("reservation %+v; want a state-store port in %v", r, allocRange)
		}
		_ = listen(t, r.Addr, r.Port).Close()
	}
}

// TestForeignListenersSkipped: four of a five-port range are held by plain
// listeners outside berth; Allocate returns the fifth, then runs out.
func TestForeignListenersSkipped(t *testing.T) {
	base := freeRun(t, 5)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: portalloc.Range{First: base, Last: base + 4}})
	for p := base; p < base+4; p++ {
		defer listen(t, lo4, p).Close()
	}
	r, err := a.Allocate(context.Background(), portalloc.Request{})
	if err != nil || r.Port != base+4 {
		t.Fatalf("Allocate = %+v, %v; want port %d", r, err, base+4)
	}
	_, err = a.Allocate(context.Background(), portalloc.Request{})
	if !errors.Is(err, portalloc.ErrRangeExhausted) {
		t.Fatalf("second Allocate = %v; want ErrRangeExhausted", err)
	}
	if !strings.Contains(err.Error(), strconv.Itoa(int(base))) {
		t.Errorf("error %q does not name the range", err)
	}
}

// TestWildcardsThroughAPI: another process holds 0.0.0.0:p. 127.0.0.1:p and
// :::p are refused with a message naming the holder. So is [::1]:p: Go
// binds 0.0.0.0 as a dual-stack socket, and Linux refuses an IPv6 socket that
// is not V6ONLY beside an IPv4 wildcard, so the two could not both bind (see
// package netaddr). A specific IPv6 address beside a specific IPv4 address
// is fine.
func TestWildcardsThroughAPI(t *testing.T) {
	dir := t.TempDir()
	port := freeRun(t, 1)
	pid := holdInWorker(t, dir, any4, port).cmd.Process.Pid
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	for _, addr := range []netip.Addr{lo4, any6, lo6, any4} {
		_, err := a.Reserve(context.Background(), portalloc.Request{Addr: addr}, port)
		var ce *portalloc.ConflictError
		if !errors.Is(err, portalloc.ErrPortHeld) || !errors.As(err, &ce) {
			t.Fatalf("Reserve(%s:%d) = %v; want ErrPortHeld", addr, port, err)
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
	var ce *portalloc.ConflictError
	if !errors.As(err, &ce) || !ce.Self {
		t.Fatalf("Reserve under own wildcard = %v; want a ConflictError with Self", err)
	}
	if !strings.Contains(err.Error(), "this process's own reservation of tcp 0.0.0.0:") {
		t.Errorf("error %q does not say the holder is this process's own wildcard", err)
	}
	// The exact same key again is not a conflict: it is the same reservation.
	again, err := a.Reserve(context.Background(), portalloc.Request{Addr: any4}, r.Port)
	if err != nil || again.Port != r.Port {
		t.Errorf("Reserve of own exact key = %+v, %v; want it back", again, err)
	}
}

// TestFallback: the database path is a directory. With fallback the MRU
// file serves, and the switch is logged once; strict mode refuses.
func TestFallback(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "berth.db"), 0o700); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		logs []string
	)
	log := funcr.New(func(prefix, args string) { mu.Lock(); logs = append(logs, args); mu.Unlock() }, funcr.Options{})
	a := newAllocator(t, portalloc.Config{StateDir: dir, Logger: log})
	if got := a.Backend(); got != portalloc.BackendMRU {
		t.Errorf("Backend() = %q; want mru", got)
	}
	if cause := a.FallbackCause(); cause == nil || !strings.Contains(cause.Error(), "is a directory") {
		t.Errorf("FallbackCause() = %v; want the directory in the way", cause)
	}
	// The MRU file cannot read the store to skip the ports it holds: in
	// the default mode it hands out none.
	if r, err := a.Allocate(context.Background(), portalloc.Request{}); !errors.Is(err, portalloc.ErrStoreUnavailable) || errors.Is(err, portalloc.ErrTransient) ||
		!strings.Contains(err.Error(), "cannot read the store") || !strings.Contains(err.Error(), "BERTH_MODE=mru") {
		t.Fatalf("Allocate with a store that cannot be read = %+v, %v; want ErrStoreUnavailable saying the MRU file cannot read the store, and what to do", r, err)
	}
	// ModeMRU, chosen on purpose, serves blind.
	m := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeMRU, Logger: log})
	seen := map[uint16]bool{}
	for range 5 {
		r, err := m.Allocate(context.Background(), portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Backend != portalloc.BackendMRU || seen[r.Port] {
			t.Errorf("Allocate = %+v; want a fresh port from mru", r)
		}
		seen[r.Port] = true
		_ = listen(t, r.Addr, r.Port).Close()
	}
	mu.Lock()
	n := 0
	for _, l := range logs {
		if strings.Contains(l, "state store unavailable") {
			n++
		}
	}
	mu.Unlock()
	if n != 1 {
		t.Errorf("fallback logged %d times; want once. Log: %q", n, logs)
	}
	if fi, err := os.Stat(filepath.Join(dir, "berth.db")); err != nil || !fi.IsDir() {
		t.Errorf("the directory in the way was changed: %v %v", fi, err)
	}

	_, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	if !errors.Is(err, portalloc.ErrStoreUnavailable) {
		t.Errorf("New(strict) = %v; want ErrStoreUnavailable", err)
	}
}

// TestCloseReleases: after Close another Allocator can reserve the same
// ports, and the closed one refuses calls.
func TestCloseReleases(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: allocRange})
	if err != nil {
		t.Fatal(err)
	}
	var rs []portalloc.Reservation
	for range 3 {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	static, err := a.Reserve(ctx, portalloc.Request{Protocol: portalloc.UDP}, freeRun(t, 1))
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
	if _, err := b.Reserve(ctx, portalloc.Request{Addr: any4}, rs[0].Port); !errors.Is(err, portalloc.ErrPortHeld) {
		t.Fatalf("Reserve of a held port = %v; want ErrPortHeld", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	for _, r := range rs {
		if _, err := b.Reserve(ctx, portalloc.Request{Protocol: r.Protocol, Addr: any4}, r.Port); err != nil {
			t.Errorf("Reserve(%s) after the holder closed = %v", r, err)
		}
	}
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, portalloc.ErrClosed) {
		t.Errorf("Allocate after Close = %v; want ErrClosed", err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, 20000); !errors.Is(err, portalloc.ErrClosed) {
		t.Errorf("Reserve after Close = %v; want ErrClosed", err)
	}
	if err := a.Transfer(ctx, rs[0], os.Getpid()); !errors.Is(err, portalloc.ErrClosed) {
		t.Errorf("Transfer after Close = %v; want ErrClosed", err)
	}
}

// TestReleaseNeverPanics: releasing twice, or something never reserved,
// returns an error for logging and changes nothing else.
func TestRelease(t *testing.T) {
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	r, err := a.Allocate(ctx, portalloc.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, r); err != nil {
		t.Errorf("Release = %v", err)
	}
	// Releasing what is released already is ErrNotHeld, said once, in
	// portalloc's words.
	err = a.Release(ctx, r)
	if !errors.Is(err, portalloc.ErrNotHeld) {
		t.Errorf("second Release = %v; want ErrNotHeld", err)
	} else if msg := err.Error(); strings.Count(msg, r.String()) != 1 || strings.Contains(msg, "statestore") || !strings.HasPrefix(msg, "portalloc: release ") {
		t.Errorf("second Release says %q; want one prefix naming the reservation once", msg)
	}
	if err := a.Release(ctx, portalloc.Reservation{}); !errors.Is(err, portalloc.ErrInvalidRequest) {
		t.Errorf("Release(zero) = %v; want ErrInvalidRequest", err)
	}
}

func TestContextAndTimeout(t *testing.T) {
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if _, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Allocate(cancelled) = %v; want context.Canceled", err)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, 20001); !errors.Is(err, context.Canceled) {
		t.Errorf("Reserve(cancelled) = %v; want context.Canceled", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cancelled calls took %v", d)
	}

	// Timeout bounds New's opening of the store as well.
	_, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Timeout: time.Nanosecond})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, portalloc.ErrStoreUnavailable) {
		t.Errorf("New with a spent Timeout = %v; want ErrStoreUnavailable and DeadlineExceeded", err)
	}
}

// TestBadInput: each bad value is a clear error wrapping ErrInvalidRequest,
// and nothing is written.
func TestBadInput(t *testing.T) {
	for _, s := range []string{"", "abc", "0-10", "30000-20000", "1-70000", " 1-2"} {
		if r, err := portalloc.ParseRange(s); !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), strconv.Quote(s)) {
			t.Errorf("ParseRange(%q) = %v, %v; want ErrInvalidRequest quoting the input", s, r, err)
		}
	}

	dir := t.TempDir()
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir})
	ctx := context.Background()
	checks := []struct {
		name string
		err  error
		want string
	}{}
	_, err := a.Reserve(ctx, portalloc.Request{}, 0)
	checks = append(checks, struct {
		name string
		err  error
		want string
	}{"Reserve(0)", err, `port "0"`})
	_, err = a.Allocate(ctx, portalloc.Request{Addr: netip.MustParseAddr("fe80::1%lo")})
	checks = append(checks, struct {
		name string
		err  error
		want string
	}{"zoned", err, "zone"})
	_, err = a.Allocate(ctx, portalloc.Request{Protocol: "sctp"})
	checks = append(checks, struct {
		name string
		err  error
		want string
	}{"sctp", err, `"tcp" or "udp"`})
	_, err = a.Allocate(ctx, portalloc.Request{Addr: netip.MustParseAddr("192.0.2.1")})
	checks = append(checks, struct {
		name string
		err  error
		want string
	}{"foreign address", err, `Request.Addr "192.0.2.1": want an address of this host`})
	for _, c := range checks {
		if !errors.Is(c.err, portalloc.ErrInvalidRequest) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error = %v; want ErrInvalidRequest saying %q", c.name, c.err, c.want)
		}
	}
	if h := a.Held(); len(h) != 0 {
		t.Errorf("Held() after bad requests = %v; want none", h)
	}

	t.Setenv(portalloc.EnvMode, "turbo")
	if _, err := portalloc.ConfigFromEnv(); !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), "BERTH_MODE") {
		t.Errorf("ConfigFromEnv(BERTH_MODE=turbo) = %v; want ErrInvalidRequest naming BERTH_MODE", err)
	}

	fresh := filepath.Join(t.TempDir(), "never")
	for _, cfg := range []portalloc.Config{
		{StateDir: fresh, Mode: "turbo"},
		{StateDir: fresh, Range: portalloc.Range{First: 30000, Last: 20000}},
		{StateDir: fresh, Range: portalloc.Range{First: 0, Last: 10}},
		{StateDir: fresh, Exclude: []portalloc.Range{{First: 5, Last: 1}}},
		{StateDir: fresh, Timeout: -time.Second},
		{StateDir: fresh, Range: portalloc.Range{First: 40000, Last: 40010}}, // inside the Linux ephemeral range
	} {
		if cfg.Range.First == 40000 {
			if eph, _ := ephemeral(); !eph.Contains(40000) || !eph.Contains(40010) {
				continue
			}
		}
		a, err := portalloc.New(ctx, cfg)
		if err == nil {
			_ = a.Close()
		}
		if !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("New(%+v) = %v; want ErrInvalidRequest", cfg, err)
		}
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("a rejected configuration created %s", fresh)
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv(portalloc.EnvMode, "mru")
	t.Setenv(portalloc.EnvPortRange, "21000-21999")
	t.Setenv(portalloc.EnvPortExclude, "21100-21199,21500")
	t.Setenv(portalloc.EnvStateDir, "/tmp/x")
	t.Setenv(portalloc.EnvTimeout, "3s")
	t.Setenv(portalloc.EnvAllowEphemeralOverlap, "true")
	c, err := portalloc.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	want := portalloc.Config{
		Mode: portalloc.ModeMRU, Range: portalloc.Range{First: 21000, Last: 21999},
		Exclude:  []portalloc.Range{{First: 21100, Last: 21199}, {First: 21500, Last: 21500}},
		StateDir: "/tmp/x", Timeout: 3 * time.Second, AllowEphemeralOverlap: true,
	}
	if c.Mode != want.Mode || c.Range != want.Range || len(c.Exclude) != 2 || c.Exclude[1] != want.Exclude[1] ||
		c.StateDir != want.StateDir || c.Timeout != want.Timeout || !c.AllowEphemeralOverlap {
		t.Errorf("ConfigFromEnv = %+v; want %+v", c, want)
	}
	for name, value := range map[string]string{
		portalloc.EnvPortRange:             "1-2-3",
		portalloc.EnvPortExclude:           "5,,6",
		portalloc.EnvTimeout:               "soon",
		portalloc.EnvAllowEphemeralOverlap: "maybe",
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			if _, err := portalloc.ConfigFromEnv(); !errors.Is(err, portalloc.ErrInvalidRequest) || !strings.Contains(err.Error(), name) {
				t.Errorf("ConfigFromEnv(%s=%q) = %v; want ErrInvalidRequest naming %s", name, value, err, name)
			}
		})
	}
}

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
	var ce *portalloc.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != pid {
		t.Errorf("Reserve after Transfer = %v; want held by pid %d", err, pid)
	}
	if err := a.Transfer(ctx, r, 1<<30); !errors.Is(err, portalloc.ErrInvalidRequest) {
		t.Errorf("Transfer to a pid that does not run = %v; want ErrInvalidRequest", err)
	}
}

// freeRun is testrig.FreeRun: n consecutive free ports of pickRange.
var freeRun = testrig.FreeRun
