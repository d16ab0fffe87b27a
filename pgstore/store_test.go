package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

func key(p store.Protocol, addr string, port uint16) store.Key {
	return store.Key{Protocol: p, Addr: netip.MustParseAddr(addr), Port: port}
}

// bound is a probe's verdict on a port some process outside berth has
// bound.
func bound(k store.Key) error { return &store.ConflictError{Key: k, Bound: true} }

func TestSkipsWithoutServer(t *testing.T) {
	if os.Getenv(envDSN) != "" {
		t.Skip("a server is configured; this test shows the message given without one")
	}
	defer func() {
		if !t.Skipped() {
			t.Error("testDB did not skip without " + envDSN)
		}
	}()
	testDB(t)
}

// TestExclusionRefusesRawInsert: the database, not berth's code, refuses a
// conflicting row, and an address in a second spelling.
func TestExclusionRefusesRawInsert(t *testing.T) {
	dsn, conn := testDB(t)
	s := open(t, dsn, "h1")
	open(t, dsn, "h2")
	ctx := context.Background()
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 42000)}); err != nil {
		t.Fatal(err)
	}
	insert := func(host, proto, addr string, port int) error {
		_, err := conn.Exec(ctx, `INSERT INTO berth_port_allocations
			(host_no, protocol, port, address, owner_pid, owner_start, kind)
			SELECT host_no, $2, $3, $4::inet, 1, 1, 'static' FROM berth_hosts WHERE host_id = $1`, host, proto, port, addr)
		return err
	}
	for _, c := range []struct {
		host, proto, addr string
		port              int
		code              string // "" for accepted
	}{
		{"h1", "tcp", "127.0.0.1", 42000, "23P01"},        // equal
		{"h1", "tcp", "0.0.0.0", 42000, "23P01"},          // IPv4 wildcard over it
		{"h1", "tcp", "::", 42000, "23P01"},               // IPv6 wildcard over it
		{"h1", "tcp", "::ffff:127.0.0.1", 42000, "23514"}, // a second spelling
		{"h1", "tcp", "127.0.0.0/8", 42001, "23514"},      // a network, not an address
		{"h1", "udp", "127.0.0.1", 42000, ""},             // another protocol
		{"h1", "tcp", "::1", 42000, ""},                   // another address
		{"h2", "tcp", "0.0.0.0", 42000, ""},               // another host
		{"h1", "udp", "::", 42000, "23P01"},               // over the udp row above
		{"h2", "tcp", "127.0.0.1", 42000, "23P01"},        // under h2's wildcard
	} {
		err := insert(c.host, c.proto, c.addr, c.port)
		var pgErr *pgconn.PgError
		switch {
		case c.code == "" && err != nil:
			t.Errorf("raw insert %s %s %s:%d = %v; want accepted", c.host, c.proto, c.addr, c.port, err)
		case c.code != "" && (!errors.As(err, &pgErr) || pgErr.Code != c.code):
			t.Errorf("raw insert %s %s %s:%d = %v; want SQLSTATE %s", c.host, c.proto, c.addr, c.port, err, c.code)
		}
	}
	// Nor can a writer move a row onto another: the spans follow.
	_, err := conn.Exec(ctx, "UPDATE berth_port_allocations SET address = '0.0.0.0' WHERE protocol = 'tcp' AND address = '::1'")
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "23P01" {
		t.Errorf("raw update onto a wildcard = %v; want SQLSTATE 23P01", err)
	}
	_, err = conn.Exec(ctx, "UPDATE berth_port_allocations SET addr_span = NULL")
	if err == nil {
		t.Error("raw update of the generated span succeeded; want refused")
	}
}

func TestReserveSameOwner(t *testing.T) {
	dsn, _ := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	k := key(store.TCP, "127.0.0.1", 43000)
	first, err := s.Reserve(ctx, store.Request{Key: k, Label: "web"})
	if err != nil {
		t.Fatal(err)
	}
	probed := false
	again, err := s.Reserve(ctx, store.Request{Key: k, Label: "other", Probe: func(k store.Key) error { probed = true; return bound(k) }})
	if err != nil {
		t.Fatalf("second Reserve by the same owner = %v; want its row", err)
	}
	if again.Label != "web" || !again.Created.Equal(first.Created) || probed {
		t.Errorf("second Reserve = %+v (probed %v); want the first row %+v without a probe", again, probed, first)
	}
	// The owner's own wildcard stands in the way of its specific address.
	w := key(store.TCP, "0.0.0.0", 43001)
	if _, err := s.Reserve(ctx, store.Request{Key: w}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Reserve(ctx, store.Request{Key: key(store.TCP, "::1", 43001)})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Self || ce.Holder.Key != w {
		t.Errorf("Reserve under own wildcard = %v; want a *ConflictError with Self naming %s", err, w)
	}
}

func TestProbeFailureDeletesRow(t *testing.T) {
	dsn, conn := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	k := key(store.UDP, "::1", 44000)
	var during int
	_, err := s.Reserve(ctx, store.Request{Key: k, Probe: func(k store.Key) error {
		// The row is in while the probe runs: nobody else can be granted.
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations WHERE port = 44000").Scan(&during); err != nil {
			t.Error(err)
		}
		return bound(k)
	}})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Holder.Owner.IsZero() || !ce.Bound {
		t.Fatalf("Reserve with a failing probe = %v; want the probe's *ConflictError, naming no owner", err)
	}
	if during != 1 {
		t.Errorf("rows during the probe = %d; want 1", during)
	}
	if rows, _ := s.List(ctx, store.Filter{}); len(rows) != 0 {
		t.Errorf("rows after a failed probe = %v; want none", rows)
	}
	if got := s.Stats().ProbeFailures; got != 1 {
		t.Errorf("Stats().ProbeFailures = %d; want 1", got)
	}
	// A panicking probe leaves no row either, and the panic goes on.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a panicking probe did not panic through Reserve")
			}
		}()
		_, _ = s.Reserve(ctx, store.Request{Key: k, Probe: func(store.Key) error { panic("probe") }})
	}()
	if rows, _ := s.List(ctx, store.Filter{}); len(rows) != 0 {
		t.Errorf("rows after a panicking probe = %v; want none", rows)
	}
	// A probe that fails otherwise fails the call, wrapping its error,
	// and leaves no row.
	broken := errors.New("probe broke")
	_, err = s.Reserve(ctx, store.Request{Key: k, Probe: func(store.Key) error { return broken }})
	if !errors.Is(err, broken) || errors.Is(err, store.ErrHeld) {
		t.Errorf("Reserve with a probe that errs = %v; want its error, not ErrHeld", err)
	}
	if rows, _ := s.List(ctx, store.Filter{}); len(rows) != 0 {
		t.Errorf("rows after a probe that erred = %v; want none", rows)
	}
	if got := s.Stats().ProbeFailures; got != 1 {
		t.Errorf("Stats().ProbeFailures after a probe that erred = %d; want still 1", got)
	}
}

// TestDeadOwnerReaped: a row of an exited process of this host gives way
// to a new owner and to Reap; a live one does not.
func TestDeadOwnerReaped(t *testing.T) {
	dsn, _ := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	gone, stop := child(t)
	live, _ := child(t)
	k := key(store.TCP, "0.0.0.0", 45000)
	if _, err := s.Reserve(ctx, store.Request{Key: k, Owner: gone}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint16{45001, 45002} {
		if _, err := s.Reserve(ctx, store.Request{Key: key(store.UDP, "::1", p), Owner: gone}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.UDP, "::1", 45003), Owner: live}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 45000)}); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("Reserve under a live owner's wildcard = %v; want ErrHeld", err)
	}
	stop()
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 45000)}); err != nil {
		t.Fatalf("Reserve under an exited owner's wildcard = %v; want nil", err)
	}
	if got := s.Stats().Reaped; got != 1 {
		t.Errorf("Stats().Reaped = %d; want 1", got)
	}
	n, err := s.Reap(ctx)
	if err != nil || n != 2 {
		t.Errorf("Reap() = %d, %v; want 2, nil", n, err)
	}
	rows, _ := s.List(ctx, store.Filter{})
	if len(rows) != 2 {
		t.Errorf("List after Reap = %v; want this process's and the live child's rows", rows)
	}
}

func TestReleaseAndTransferAreOwnerChecked(t *testing.T) {
	dsn, _ := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	kid, _ := child(t)
	k := key(store.TCP, "127.0.0.1", 46000)
	if _, err := s.Reserve(ctx, store.Request{Key: k}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, k, kid); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release by a non-owner = %v; want ErrNotFound", err)
	}
	if err := s.Transfer(ctx, k, kid, kid); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Transfer from a non-owner = %v; want ErrNotFound", err)
	}
	if err := s.Release(ctx, key(store.TCP, "127.0.0.2", 46000), store.Owner{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release of a key not held = %v; want ErrNotFound", err)
	}
	if err := s.Transfer(ctx, k, store.Owner{}, kid); err != nil {
		t.Fatalf("Transfer to a child = %v", err)
	}
	rows, _ := s.List(ctx, store.Filter{OwnerPID: kid.PID})
	if len(rows) != 1 || !rows[0].Owner.Same(kid) {
		t.Fatalf("List by the child's pid = %v; want its one row", rows)
	}
	if err := s.Release(ctx, k, store.Owner{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release by the former owner = %v; want ErrNotFound", err)
	}
	if err := s.Release(ctx, k, kid); err != nil {
		t.Errorf("Release by the new owner = %v; want nil", err)
	}
	dead := kid
	dead.PID, dead.Start = 1<<30, 12345
	if err := s.Transfer(ctx, k, store.Owner{}, dead); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Transfer to a process that does not run = %v; want ErrInvalid", err)
	}
}

func TestScan(t *testing.T) {
	dsn, _ := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	kid, _ := child(t)
	for _, p := range []uint16{47000, 47001} {
		if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "0.0.0.0", p), Owner: kid}); err != nil {
			t.Fatal(err)
		}
	}
	probe := func(k store.Key) error {
		if k.Port == 47002 {
			return bound(k)
		}
		return nil
	}
	req := store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Probe: probe, Batch: 2}

	req.Next = storetest.Candidates(47000, 47001, 47002)
	if _, err := s.Scan(ctx, req); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Scan over held and bound ports = %v; want ErrExhausted", err)
	}
	if got := s.Stats().ProbeFailures; got != 1 {
		t.Errorf("Stats().ProbeFailures = %d; want 1", got)
	}
	req.Next = storetest.Candidates(47000, 47002, 47001, 47004, 47003)
	r, err := s.Scan(ctx, req)
	if err != nil || r.Port != 47004 || r.Kind != store.Dynamic {
		t.Errorf("Scan = %+v, %v; want 47004 (the first free candidate), dynamic", r, err)
	}
	// The same port again for another address is fine; for this one not.
	req.Next = storetest.Candidates(47004)
	req.Addr = netip.MustParseAddr("::1")
	if r, err := s.Scan(ctx, req); err != nil || r.Port != 47004 {
		t.Errorf("Scan on ::1 = %+v, %v; want 47004", r, err)
	}
	req.Next = storetest.Candidates(47004)
	if _, err := s.Scan(ctx, req); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Scan of a port this owner holds = %v; want ErrExhausted", err)
	}
	// Exhaustion after many batches of held ports.
	var many []uint16
	for p := uint16(47100); p < 47200; p++ {
		if _, err := s.Reserve(ctx, store.Request{Key: key(store.UDP, "::", p), Owner: kid}); err != nil {
			t.Fatal(err)
		}
		many = append(many, p)
	}
	req = store.ScanRequest{Protocol: store.UDP, Addr: netip.MustParseAddr("10.0.0.1"), Next: storetest.Candidates(many...)}
	if _, err := s.Scan(ctx, req); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Scan of 100 held ports = %v; want ErrExhausted", err)
	}
}

// TestScanReapsWhenAllHeld: a batch that only exited owners hold is
// cleared and granted.
func TestScanReapsWhenAllHeld(t *testing.T) {
	dsn, _ := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	gone, stop := child(t)
	for _, p := range []uint16{48000, 48001} {
		if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", p), Owner: gone}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Next: storetest.Candidates(48000, 48001)})
	if err != nil || r.Port != 48000 {
		t.Errorf("Scan over exited owners' rows = %+v, %v; want 48000", r, err)
	}
	if got := s.Stats().Reaped; got != 2 {
		t.Errorf("Stats().Reaped = %d; want 2", got)
	}
}

func TestScanBlockAllOrNone(t *testing.T) {
	dsn, _ := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	kid, _ := child(t)
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "::", 49002), Owner: kid}); err != nil {
		t.Fatal(err)
	}
	req := store.ScanRequest{
		Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"),
		Next: storetest.Candidates(65534, 49000, 49010, 49020),
		Probe: func(k store.Key) error {
			if k.Port == 49012 {
				return bound(k)
			}
			return nil
		},
	}
	rs, err := s.ScanBlock(ctx, req, 4)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint16
	for _, r := range rs {
		got = append(got, r.Port)
	}
	if fmt.Sprint(got) != "[49020 49021 49022 49023]" {
		t.Errorf("ScanBlock = %v; want 49020-49023 (49000 holds a held port, 49010 a bound one, 65534 passes 65535)", got)
	}
	mine, _ := s.List(ctx, store.Filter{OwnerPID: os.Getpid()})
	if len(mine) != 4 {
		t.Errorf("rows after ScanBlock = %v; want the block's 4 and nothing of the refused blocks", mine)
	}
	req.Next = storetest.Candidates(49000, 49001)
	req.Probe = nil
	if _, err := s.ScanBlock(ctx, req, 3); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ScanBlock over a held port = %v; want ErrExhausted", err)
	}
	if _, err := s.ScanBlock(ctx, req, 0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("ScanBlock(0) = %v; want ErrInvalid", err)
	}
}

func TestStickyPortsPerHost(t *testing.T) {
	dsn, _ := testDB(t)
	a, b := open(t, dsn, "h1"), open(t, dsn, "h2")
	ctx := context.Background()
	if _, ok, err := a.Recall(ctx, "web", store.TCP); ok || err != nil {
		t.Errorf("Recall before Remember = %v, %v; want false, nil", ok, err)
	}
	if err := a.Remember(ctx, "web", store.TCP, 50000); err != nil {
		t.Fatal(err)
	}
	if err := a.Remember(ctx, "web", store.TCP, 50001); err != nil {
		t.Fatal(err)
	}
	if p, ok, err := a.Recall(ctx, "web", store.TCP); p != 50001 || !ok || err != nil {
		t.Errorf("Recall = %d, %v, %v; want 50001, true, nil", p, ok, err)
	}
	if _, ok, _ := a.Recall(ctx, "web", store.UDP); ok {
		t.Error("Recall for udp found the tcp port")
	}
	if _, ok, _ := b.Recall(ctx, "web", store.TCP); ok {
		t.Error("another host recalled this host's sticky port")
	}
	if err := a.Remember(ctx, "", store.TCP, 1); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Remember without a label = %v; want ErrInvalid", err)
	}
}

// TestTwoHosts: two hosts hold the same port independently, and each
// sees, releases and reaps only its own rows.
func TestTwoHosts(t *testing.T) {
	dsn, conn := testDB(t)
	a, b := open(t, dsn, "host-a"), open(t, dsn, "host-b")
	ctx := context.Background()
	k := key(store.TCP, "0.0.0.0", 51000)
	if _, err := a.Reserve(ctx, store.Request{Key: k, Label: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, store.Request{Key: k, Label: "b"}); err != nil {
		t.Fatalf("host b's Reserve of a port host a holds = %v; want nil", err)
	}
	for _, c := range []struct {
		s    *pgstore.Store
		want string
	}{{a, "a"}, {b, "b"}} {
		rows, err := c.s.List(ctx, store.Filter{})
		if err != nil || len(rows) != 1 || rows[0].Label != c.want {
			t.Errorf("%s: List = %v, %v; want its own row only", c.s.Host(), rows, err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations WHERE port = 51000").Scan(&n); err != nil || n != 2 {
		t.Errorf("rows of port 51000 = %d, %v; want 2", n, err)
	}
	if err := a.Release(ctx, k, store.Owner{}); err != nil {
		t.Fatal(err)
	}
	if rows, _ := b.List(ctx, store.Filter{}); len(rows) != 1 {
		t.Errorf("host b's rows after host a released = %v; want its one", rows)
	}
	// The lease is set from the server's clock, for the lease's length.
	var left time.Duration
	if err := conn.QueryRow(ctx, "SELECT expires_at - now() FROM berth_hosts WHERE host_id = 'host-a'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left <= 0 || left > 30*time.Second {
		t.Errorf("host lease expires in %v; want within the default 30s", left)
	}
}

// TestRaceForOnePort: goroutines of different owners race for one port
// and exactly one wins, for each of several ports.
func TestRaceForOnePort(t *testing.T) {
	dsn, conn := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	const racers = 6
	owners := make([]store.Owner, racers)
	for i := range owners {
		owners[i], _ = child(t)
	}
	addrs := []string{"127.0.0.1", "0.0.0.0", "::", "::1", "127.0.0.1", "0.0.0.0"}
	for port := uint16(52000); port < 52020; port++ {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			won  []store.Key
			bad  []error
			gate = make(chan struct{})
		)
		for i := range racers {
			wg.Go(func() {
				<-gate
				k := key(store.TCP, addrs[(i+int(port))%len(addrs)], port)
				_, err := s.Reserve(ctx, store.Request{Key: k, Owner: owners[i]})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won = append(won, k)
				case !errors.Is(err, store.ErrHeld):
					bad = append(bad, err)
				}
			})
		}
		close(gate)
		wg.Wait()
		if len(bad) > 0 {
			t.Fatalf("port %d: unexpected errors %v", port, bad)
		}
		for i := range won {
			for j := i + 1; j < len(won); j++ {
				if won[i].Conflicts(won[j]) {
					t.Errorf("port %d: both %s and %s were granted", port, won[i], won[j])
				}
			}
		}
		if len(won) == 0 {
			t.Errorf("port %d: nobody won", port)
		}
	}
	// Same address for all: exactly one winner; and Scan racers get
	// distinct ports.
	var wg sync.WaitGroup
	results := make(chan error, racers)
	for i := range racers {
		wg.Go(func() {
			_, err := s.Reserve(ctx, store.Request{Key: key(store.UDP, "::1", 52100), Owner: owners[i]})
			results <- err
		})
	}
	wg.Wait()
	close(results)
	wins := 0
	for err := range results {
		if err == nil {
			wins++
		} else if !errors.Is(err, store.ErrHeld) {
			t.Error(err)
		}
	}
	if wins != 1 {
		t.Errorf("racers for udp [::1]:52100 won %d times; want exactly 1", wins)
	}
	got := make(chan store.Reservation, racers)
	for i := range racers {
		wg.Go(func() {
			r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("10.9.9.9"), Owner: owners[i],
				Next: storetest.Candidates(52200, 52201, 52202, 52203)})
			if err == nil {
				got <- r
			} else if !errors.Is(err, store.ErrExhausted) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	close(got)
	seen := map[uint16]bool{}
	for r := range got {
		if seen[r.Port] {
			t.Errorf("port %d granted twice by Scan", r.Port)
		}
		seen[r.Port] = true
	}
	if len(seen) != 4 {
		t.Errorf("Scan racers got %d ports; want all 4", len(seen))
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations WHERE port BETWEEN 52200 AND 52203").Scan(&n); err != nil || n != 4 {
		t.Errorf("rows of the scanned ports = %d, %v; want 4", n, err)
	}
}

func TestSchemaTooNew(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	s := open(t, dsn, "h1")
	_ = s.Close()
	var v int
	if err := conn.QueryRow(ctx, "SELECT version FROM berth_schema_migrations").Scan(&v); err != nil || v != int(pgstore.SchemaVersion) {
		t.Fatalf("schema version = %d, %v; want %d", v, err, pgstore.SchemaVersion)
	}
	if _, err := conn.Exec(ctx, "UPDATE berth_schema_migrations SET version = version + 1"); err != nil {
		t.Fatal(err)
	}
	_, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: "h1", SweepInterval: -1})
	if !errors.Is(err, store.ErrSchemaTooNew) {
		t.Errorf("Open of a newer schema = %v; want ErrSchemaTooNew", err)
	}
}

// TestDirtyMigrationResolved: a dirty mark on a version whose body
// committed is cleared, and Open goes on.
func TestDirtyMigrationResolved(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	_ = open(t, dsn, "h1").Close()
	if _, err := conn.Exec(ctx, "UPDATE berth_schema_migrations SET dirty = true"); err != nil {
		t.Fatal(err)
	}
	s := open(t, dsn, "h1")
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 53000)}); err != nil {
		t.Error(err)
	}
	var dirty bool
	if err := conn.QueryRow(ctx, "SELECT dirty FROM berth_schema_migrations").Scan(&dirty); err != nil || dirty {
		t.Errorf("dirty after Open = %v, %v; want false", dirty, err)
	}
}

// TestConcurrentOpen: stores opened together on a fresh schema migrate
// it once.
func TestConcurrentOpen(t *testing.T) {
	dsn, conn := testDB(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Host: fmt.Sprint("h", i%2), SweepInterval: -1})
			if err == nil {
				err = s.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM berth_schema_history").Scan(&n); err != nil || n != int(pgstore.SchemaVersion) {
		t.Errorf("migrations applied = %d, %v; want %d", n, err, pgstore.SchemaVersion)
	}
}

// TestLostConnection: connections the server ends, and a server that is
// not there, fail calls with ErrStorage; a closed store with ErrClosed.
func TestLostConnection(t *testing.T) {
	dsn, conn := testDB(t)
	s := open(t, pgschema.WithParam(dsn, "application_name", "berth-lost"), "h1")
	ctx := context.Background()
	k := key(store.TCP, "127.0.0.1", 54000)
	if _, err := s.Reserve(ctx, store.Request{Key: k}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND application_name = 'berth-lost'"); err != nil {
		t.Fatal(err)
	}
	_, err := s.List(ctx, store.Filter{})
	if err != nil && !errors.Is(err, store.ErrStorage) {
		t.Errorf("List on a terminated connection = %v; want nil or ErrStorage", err)
	}
	if _, err := s.List(ctx, store.Filter{}); err != nil {
		t.Errorf("List after the pool replaced its connection = %v; want nil", err)
	}

	_, err = pgstore.Open(ctx, "host=/nonexistent/berth dbname=postgres user=postgres connect_timeout=2", pgstore.Options{Host: "h1"})
	if !errors.Is(err, store.ErrStorage) {
		t.Errorf("Open with no server = %v; want ErrStorage", err)
	}
	_ = s.Close()
	if err := s.Release(ctx, k, store.Owner{}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Release after Close = %v; want ErrClosed", err)
	}
}

func TestInvalid(t *testing.T) {
	dsn, _ := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	for _, req := range []store.Request{
		{Key: store.Key{Protocol: "sctp", Addr: netip.MustParseAddr("::1"), Port: 1}},
		{Key: store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("::1"), Port: 0}},
		{Key: store.Key{Protocol: store.TCP, Port: 1}},
		{Key: key(store.TCP, "::1", 1), Kind: "odd"},
		{Key: key(store.TCP, "::1", 1), Owner: store.Owner{PID: -1}},
	} {
		if _, err := s.Reserve(ctx, req); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Reserve(%+v) = %v; want ErrInvalid", req, err)
		}
	}
	_, err := pgstore.Open(ctx, "host=/tmp port=notaport", pgstore.Options{})
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "dsn" || !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Open with a bad DSN = %v; want a *store.FieldError for dsn", err)
	}
	// An IPv4-mapped address is stored as IPv4.
	r, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "::ffff:127.0.0.1", 55000)})
	if err != nil || r.Addr != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("Reserve of ::ffff:127.0.0.1 = %+v, %v; want 127.0.0.1", r, err)
	}
	rows, _ := s.List(ctx, store.Filter{Port: 55000})
	if len(rows) != 1 || rows[0].Addr != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("List = %v; want the row on 127.0.0.1", rows)
	}
}

// TestNamedHoldersAreFleetWide: the calls for a host's processes refuse
// a named holder, whose reservations are fleet-wide (ReserveFleet): as
// the owner of a reservation or the one it is transferred to; Renew, the
// lease renewal of a host's named holders, refuses too, and List finds no
// row of theirs. Nothing changes.
func TestNamedHoldersAreFleetWide(t *testing.T) {
	dsn, conn := testDB(t)
	s := open(t, dsn, "h1")
	ctx := context.Background()
	r := reserveFleet(t, s, "job/ci-7", 55100, 55109)
	holder := store.Owner{Holder: "job/ci-7"}
	refused := func(what string, err error) {
		t.Helper()
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != "owner" || !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "ReserveFleet") {
			t.Errorf("%s for a named holder = %v; want a *store.FieldError for owner pointing to ReserveFleet", what, err)
		}
	}
	_, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 55000), Owner: holder, TTL: time.Minute})
	refused("Reserve", err)
	_, err = s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Owner: holder, TTL: time.Minute,
		Next: storetest.Candidates(55001)})
	refused("Scan", err)
	_, err = s.ScanBlock(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Owner: holder, TTL: time.Minute,
		Next: storetest.Candidates(55002)}, 2)
	refused("ScanBlock", err)
	refused("Release", s.Release(ctx, r.Key, holder))
	n, err := s.Renew(ctx, "job/ci-7", 2*time.Hour)
	if n != 0 {
		t.Errorf("Renew = %d; want 0", n)
	}
	refused("Renew", err)
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_port_allocations WHERE port BETWEEN 55000 AND 55003").Scan(&rows); err != nil || rows != 0 {
		t.Errorf("rows after the refusals = %d, %v; want none", rows, err)
	}
	var left time.Duration
	if err := conn.QueryRow(ctx, "SELECT lease_expires - now() FROM berth_port_allocations WHERE holder = 'job/ci-7'").Scan(&left); err != nil || left > time.Hour {
		t.Errorf("job/ci-7's lease after the refused Renew(2h) ends in %v, %v; want the hour ReserveFleet gave it", left, err)
	}
	if leases, err := s.Leases(ctx); err != nil || len(leases) != 1 || leases[0].Key != r.Key {
		t.Errorf("Leases after the refusals = %+v, %v; want the fleet-wide one only", leases, err)
	}
	// List shows process rows only: none is a named holder's.
	reserveN(t, s, 55010, 1)
	refused("Transfer", s.Transfer(ctx, key(store.TCP, "127.0.0.1", 55010), store.Owner{}, holder))
	if rows, err := s.List(ctx, store.Filter{Holder: "job/ci-7"}); err != nil || len(rows) != 0 {
		t.Errorf("List of job/ci-7's rows = %v, %v; want none (its reservation is fleet-wide: Leases lists it)", rows, err)
	}
	if rows, err := s.List(ctx, store.Filter{}); err != nil || len(rows) != 1 || rows[0].Port != 55010 || rows[0].Owner.PID != os.Getpid() {
		t.Errorf("List = %v, %v; want the process row only, still this process's", rows, err)
	}
}

// TestOpenWhileAnotherMigrates: a berth that opens the store while
// another one holds the migration lock waits for it, and then carries on
// whatever the other left: the migration done, or the latest version
// marked dirty with its body never run (the other was killed mid-way),
// which it resolves under the lock and migrates itself, once.
func TestOpenWhileAnotherMigrates(t *testing.T) {
	latest := pgstore.SchemaVersion
	// The latest migration's body, and the body that undoes it.
	migration := func(dir string) string {
		t.Helper()
		names, err := fs.Glob(os.DirFS("migrations"), fmt.Sprintf("%d_*.%s.sql", latest, dir))
		if err != nil || len(names) != 1 {
			t.Fatalf("migration %d %s: %v, %v", latest, dir, names, err)
		}
		body, err := fs.ReadFile(os.DirFS("migrations"), names[0])
		if err != nil {
			t.Fatal(err)
		}
		return string(body)
	}
	body, down := migration("up"), migration("down")
	for _, tc := range []struct {
		name  string
		other []string // what the other berth does while it holds the lock
	}{
		{"finished", []string{fmt.Sprintf("UPDATE berth_schema_migrations SET version = %d, dirty = true", latest), body, "UPDATE berth_schema_migrations SET dirty = false"}},
		{"killed", []string{fmt.Sprintf("UPDATE berth_schema_migrations SET version = %d, dirty = true", latest)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn, conn := testDB(t)
			ctx := context.Background()
			_ = open(t, dsn, "h1").Close()
			// Back to the version before the latest, clean.
			for _, q := range []string{
				down,
				fmt.Sprintf("UPDATE berth_schema_migrations SET version = %d, dirty = false", latest-1),
			} {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			var db, schema string
			if err := conn.QueryRow(ctx, "SELECT current_database(), current_schema()").Scan(&db, &schema); err != nil {
				t.Fatal(err)
			}
			lockID, err := database.GenerateAdvisoryLockId(db, schema, "berth_schema_migrations")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
				t.Fatal(err)
			}
			opened := make(chan error, 1)
			go func() {
				s, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: "h2", SweepInterval: -1})
				if err == nil {
					err = s.Close()
				}
				opened <- err
			}()
			for deadline := time.Now().Add(10 * time.Second); ; {
				var waiting int
				if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("Open never waited for the migration lock")
				}
				time.Sleep(10 * time.Millisecond)
			}
			for _, q := range tc.other {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatalf("the other berth: %v", err)
				}
			}
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", lockID); err != nil {
				t.Fatal(err)
			}
			if err := <-opened; err != nil {
				t.Fatalf("Open while another berth migrated = %v", err)
			}
			var v int64
			var dirty bool
			if err := conn.QueryRow(ctx, "SELECT version, dirty FROM berth_schema_migrations").Scan(&v, &dirty); err != nil || v != int64(latest) || dirty {
				t.Errorf("schema version after Open = %d (dirty %v), %v; want %d clean", v, dirty, err, latest)
			}
			// Its body ran once, by the other berth or by Open.
			var runs int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM berth_schema_history WHERE version = $1", int64(latest)).Scan(&runs); err != nil || runs != 1 {
				t.Errorf("the latest migration's body ran %d times (%v); want once", runs, err)
			}
		})
	}
}
