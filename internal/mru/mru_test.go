package mru_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/internal/mru"
)

var lo = netip.MustParseAddr("127.0.0.1")

func seq(ports ...uint16) func() (uint16, bool) {
	return func() (uint16, bool) {
		if len(ports) == 0 {
			return 0, false
		}
		p := ports[0]
		ports = ports[1:]
		return p, true
	}
}

func free(uint16) (bool, error) { return true, nil }

func TestSkipsRecentPorts(t *testing.T) {
	ctx := context.Background()
	f := mru.New(filepath.Join(t.TempDir(), "mru.json"), mru.Options{})
	p1, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000, 30001), Probe: free})
	if err != nil || p1 != 30000 {
		t.Fatalf("first Allocate = %d, %v; want 30000", p1, err)
	}
	p2, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000, 30001), Probe: free})
	if err != nil || p2 != 30001 {
		t.Fatalf("second Allocate = %d, %v; want 30001 (30000 is recent)", p2, err)
	}
	// Recent is per protocol.
	p3, err := f.Allocate(ctx, mru.Request{Protocol: "udp", Addr: lo, Next: seq(30000), Probe: free})
	if err != nil || p3 != 30000 {
		t.Fatalf("udp Allocate = %d, %v; want 30000", p3, err)
	}
	if _, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000, 30001), Probe: free}); !errors.Is(err, mru.ErrExhausted) {
		t.Errorf("Allocate with only recent candidates = %v; want ErrExhausted", err)
	}
}

func TestProbeFailureSkips(t *testing.T) {
	f := mru.New(filepath.Join(t.TempDir(), "mru.json"), mru.Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := netip.MustParseAddrPort(l.Addr().String()).Port()
	probe := func(p uint16) (bool, error) {
		c, err := net.Listen("tcp", netip.AddrPortFrom(lo, p).String())
		if err != nil {
			return false, nil
		}
		return true, c.Close()
	}
	got, err := f.Allocate(context.Background(), mru.Request{Protocol: "tcp", Addr: lo, Next: seq(busy, 0), Probe: probe})
	if err == nil && got == busy {
		t.Fatalf("Allocate returned port %d, which a listener holds", got)
	}
}

func TestExpiry(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	f := mru.New(filepath.Join(t.TempDir(), "mru.json"), mru.Options{Window: time.Minute, Now: func() time.Time { return now }})
	if _, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000), Probe: free}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(59 * time.Second)
	if _, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000), Probe: free}); !errors.Is(err, mru.ErrExhausted) {
		t.Errorf("Allocate inside the window = %v; want ErrExhausted", err)
	}
	now = now.Add(2 * time.Second)
	if p, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000), Probe: free}); err != nil || p != 30000 {
		t.Errorf("Allocate after the window = %d, %v; want 30000", p, err)
	}
}

func TestBoundedLength(t *testing.T) {
	ctx := context.Background()
	f := mru.New(filepath.Join(t.TempDir(), "mru.json"), mru.Options{MaxEntries: 5})
	for p := uint16(30000); p < 30020; p++ {
		if _, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(p), Probe: free}); err != nil {
			t.Fatal(err)
		}
	}
	es, err := f.Entries(ctx)
	if err != nil || len(es) != 5 || es[0].Port != 30015 || es[4].Port != 30019 {
		t.Errorf("Entries = %+v, %v; want the newest 5", es, err)
	}
}

func TestOSChoosesWithoutRange(t *testing.T) {
	f := mru.New(filepath.Join(t.TempDir(), "mru.json"), mru.Options{})
	seen := map[uint16]bool{}
	for range 20 {
		p, err := f.Allocate(context.Background(), mru.Request{Protocol: "tcp", Addr: lo})
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice within the window", p)
		}
		seen[p] = true
	}
}

// TestDamagedFileSetAside: a damaged or foreign file is logged, renamed
// aside with its bytes intact, and the allocator starts afresh.
func TestDamagedFileSetAside(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":    "\x00\x01not json",
		"foreign":    `{"hello":"world"}`,
		"newer":      `{"format":"berth-mru","version":2,"entries":[]}`,
		"bad port":   `{"format":"berth-mru","version":1,"entries":[{"protocol":"tcp","port":70000,"at":1}]}`,
		"bad proto":  `{"format":"berth-mru","version":1,"entries":[{"protocol":"sctp","port":7,"at":1}]}`,
		"port zero":  `{"format":"berth-mru","version":1,"entries":[{"protocol":"tcp","port":0,"at":1}]}`,
		"empty file": ``,
		"json array": `[]`,
		"null":       `null`,
		"truncated":  `{"format":"berth-mru","version":1,"entries":[{"proto`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "mru.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			var logged []string
			var mu sync.Mutex
			log := funcr.New(func(prefix, args string) { mu.Lock(); logged = append(logged, args); mu.Unlock() }, funcr.Options{})
			f := mru.New(path, mru.Options{Logger: log})
			if _, err := f.Allocate(context.Background(), mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000), Probe: free}); err != nil {
				t.Fatal(err)
			}
			matches, _ := filepath.Glob(path + ".bad-*")
			if len(matches) != 1 {
				t.Fatalf("set-aside files = %v; want one", matches)
			}
			kept, _ := os.ReadFile(matches[0])
			if string(kept) != content {
				t.Errorf("set-aside file holds %q; want the original %q", kept, content)
			}
			if len(logged) == 0 || !strings.Contains(strings.Join(logged, " "), "set it aside") {
				t.Errorf("log = %q; want a note that the file was set aside", logged)
			}
			if _, err := mru.Parse(mustRead(t, path)); err != nil {
				t.Errorf("fresh file does not parse: %v", err)
			}
		})
	}
}

func mustRead(tb testing.TB, path string) []byte {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestConcurrentProcessesShareFile: goroutines with their own File values on
// one path (as separate processes would have) never hand out a port twice.
func TestConcurrentShareFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mru.json")
	var (
		mu   sync.Mutex
		seen = map[uint16]int{}
		wg   sync.WaitGroup
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := mru.New(path, mru.Options{})
			for range 10 {
				next := func() func() (uint16, bool) {
					p := uint16(31000)
					return func() (uint16, bool) { p++; return p, p <= 31100 }
				}()
				port, err := f.Allocate(context.Background(), mru.Request{Protocol: "tcp", Addr: lo, Next: next, Probe: free})
				if err != nil {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
				mu.Lock()
				seen[port]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for p, n := range seen {
		if n > 1 {
			t.Errorf("port %d handed out %d times", p, n)
		}
	}
	if len(seen) != 80 {
		t.Errorf("%d distinct ports; want 80", len(seen))
	}
}

func TestBadRequest(t *testing.T) {
	f := mru.New(filepath.Join(t.TempDir(), "mru.json"), mru.Options{})
	if _, err := f.Allocate(context.Background(), mru.Request{Protocol: "sctp", Addr: lo}); err == nil {
		t.Error("Allocate(sctp) = nil error")
	}
	if _, err := f.Allocate(context.Background(), mru.Request{Protocol: "tcp", Addr: lo, Next: seq(1)}); err == nil {
		t.Error("Allocate with Next but no Probe = nil error")
	}
}

// FuzzParse: Parse never panics, and what it accepts has valid entries.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"format":"berth-mru","version":1,"entries":[{"protocol":"tcp","port":20417,"at":1763798400123}]}`))
	f.Add([]byte(`{"format":"berth-mru","version":1,"entries":null}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := mru.Parse(b)
		if err != nil {
			return
		}
		for _, e := range es {
			if (e.Protocol != "tcp" && e.Protocol != "udp") || e.Port == 0 {
				t.Fatalf("Parse accepted entry %+v", e)
			}
		}
	})
}
