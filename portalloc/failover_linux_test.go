package portalloc_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/pgserver"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// The failover tests run a primary and a streaming standby of their own
// (initdb, pg_basebackup -R), on unix sockets only, as the unprivileged
// user .ci/postgres uses; berth reaches them through one multi-host
// connection string with target_session_attrs=read-write, as an operator's
// fleet does.

// pgPair is a primary and its standby; pSock and sSock are the socket
// directories of the first primary and the first standby.
type pgPair struct {
	*pgserver.Pair
	pSock, sSock string
}

// startPair makes and starts a primary and a standby streaming from it;
// with sync the primary waits for the standby at every commit
// (synchronous_standby_names). Both are stopped and deleted when tb ends,
// whatever happened.
func startPair(tb testing.TB, sync bool) *pgPair {
	tb.Helper()
	if os.Getenv("BERTH_TEST_POSTGRES") == "" {
		tb.Skip("set BERTH_TEST_POSTGRES to run the fleet-store tests (bash .ci/postgres start prints one); the failover tests start servers of their own with the same binaries")
	}
	root, err := os.MkdirTemp("", "berth-fo.") // short: a socket path has ~100 bytes
	if err != nil {
		tb.Fatal(err)
	}
	_ = os.Remove(root) // pgserver makes it, for the servers' user
	c, err := pgserver.New(root)
	if errors.Is(err, pgserver.ErrNotInstalled) || errors.Is(err, pgserver.ErrNoUser) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			tb.Errorf("stop the failover test's servers: %v", err)
		}
	})
	c.MaxConnections, c.Sync = 60, sync
	pair, err := c.StartPair(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return &pgPair{Pair: pair, pSock: pair.Primary.Sock, sSock: pair.Standby.Sock}
}

func (c *pgPair) conn(tb testing.TB, sock string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), "host="+sock+" dbname=postgres user=postgres sslmode=disable")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// holdBack stops the standby's WAL receiver: the primary's next commits
// do not reach it, as when replication lags.
func (c *pgPair) holdBack(tb testing.TB) {
	tb.Helper()
	s := c.conn(tb, c.sSock)
	ctx := context.Background()
	if _, err := s.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		tb.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := s.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n); err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("the standby's WAL receiver did not stop in 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hostRows returns the rows of the server conn reaches as "host:port",
// sorted, and the hosts registered.
func hostRows(tb testing.TB, conn *pgx.Conn) (rows, hosts []string) {
	tb.Helper()
	ctx := context.Background()
	r, err := conn.Query(ctx, "SELECT h.host_id || ':' || p.port FROM berth_port_allocations p JOIN berth_hosts h USING (host_no) ORDER BY 1")
	if err != nil {
		tb.Fatal(err)
	}
	rows, err = pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	r, err = conn.Query(ctx, "SELECT host_id FROM berth_hosts ORDER BY 1")
	if err != nil {
		tb.Fatal(err)
	}
	hosts, err = pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return rows, hosts
}

// TestFailoverAsyncStandby: the primary dies and a standby that had not
// received its last commits is promoted, while processes of three hosts
// hold ports (one bound, the others not yet), the last of them just
// registered. The new primary lacks their latest reservations and the
// third host, and has back a row released just before. A second process of
// a host asking meanwhile for a port lost with the last commits is refused
// it: its holder's kernel lock keeps it. Without a restart, the holders put
// their rows back, the released rows are released again, every host grants
// again, and second processes are refused every port the holders keep.
func TestFailoverAsyncStandby(t *testing.T) { testFailover(t, false) }

// TestFailoverSyncStandby: the same with synchronous replication: nothing
// is lost, and only the release that failed during the outage is done
// again.
func TestFailoverSyncStandby(t *testing.T) { testFailover(t, true) }

func testFailover(t *testing.T, sync bool) { //nolint:thelper // the body of the two tests above, not a helper
	ctx := context.Background()
	c := startPair(t, sync)
	dsn := c.DSN()
	base := freeRun(t, 16)
	port := func(i int) uint16 { return base + uint16(i) }
	p := func(port uint16) string { return strconv.Itoa(int(port)) }
	// Reserved ports are base..base+7; Allocate draws from base+8...
	cfg := portalloc.Config{StoreDSN: dsn, Range: store.Range{First: port(8), Last: port(15)}, AllowEphemeralOverlap: true,
		Order: portalloc.OrderLowest, Timeout: 20 * time.Second}
	hostA, hostB, hostC := cfg, cfg, cfg
	hostA.Host, hostB.Host, hostC.Host = "fo-a", "fo-b", "fo-c"
	var logA, logB, logC logCounter
	hostA.Logger, hostB.Logger, hostC.Logger = logA.logger(), logB.logger(), logC.logger()
	a := newAllocator(t, hostA)
	b := newAllocator(t, hostB)
	reserve := func(al *portalloc.Allocator, port uint16) store.Reservation {
		t.Helper()
		r, err := al.Reserve(ctx, portalloc.Request{Label: "holder"}, port)
		if err != nil {
			t.Fatalf("Reserve(%d): %v", port, err)
		}
		return r
	}
	// Before the standby falls behind: a0 is bound, a1 is to be released,
	// a2 and b4 are not bound yet.
	reserve(a, port(0))
	l, err := net.Listen("tcp", netip.AddrPortFrom(lo4, port(0)).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a1 := reserve(a, port(1))
	reserve(a, port(2))
	reserve(b, port(4))
	b5 := reserve(b, port(5))
	if err := c.WaitStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	if !sync {
		c.holdBack(t)
	}
	// Commits the standby of the asynchronous setup never receives.
	a3 := reserve(a, port(3))
	reserve(b, port(6))
	if err := a.Release(ctx, a1); err != nil {
		t.Fatal(err)
	}
	cl := newAllocator(t, hostC)
	reserve(cl, port(7))
	want := []string{"fo-a:" + p(port(0)), "fo-a:" + p(port(2)), "fo-a:" + p(port(3)),
		"fo-b:" + p(port(4)), "fo-b:" + p(port(6)), "fo-c:" + p(port(7))}
	slices.Sort(want)

	numberOf := func(conn *pgx.Conn) int32 {
		t.Helper()
		var no int32
		if err := conn.QueryRow(ctx, "SELECT host_no FROM berth_hosts WHERE host_id = 'fo-c'").Scan(&no); err != nil {
			t.Fatal(err)
		}
		return no
	}
	noC := numberOf(c.conn(t, c.pSock))

	if err := c.Primary.Stop(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	// A release tried while no server takes writes fails.
	if err := b.Release(ctx, b5); !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, store.ErrStorage) {
		t.Fatalf("fo-b's Release while no primary runs = %v; want ErrUnavailable", err)
	}
	if err := c.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	np := c.conn(t, c.sSock)
	rows, hosts := hostRows(t, np)
	if sync {
		all := append(slices.Clone(want), "fo-b:"+p(port(5))) // its release failed
		slices.Sort(all)
		if !slices.Equal(rows, all) || !slices.Contains(hosts, "fo-c") {
			t.Fatalf("rows on the promoted synchronous standby = %v, hosts %v; want %v and fo-c: nothing lost", rows, hosts, all)
		}
	} else {
		lostWant := []string{"fo-a:" + p(port(0)), "fo-a:" + p(port(1)), "fo-a:" + p(port(2)), "fo-b:" + p(port(4)), "fo-b:" + p(port(5))}
		slices.Sort(lostWant)
		if !slices.Equal(rows, lostWant) || slices.Contains(hosts, "fo-c") {
			t.Fatalf("rows on the promoted asynchronous standby = %v, hosts %v; want %v without fo-c: the test did not lose the last commits", rows, hosts, lostWant)
		}
		// A port lost with the last commits is free on the new primary
		// until its holder puts it back, but its kernel lock is the
		// holder's still: a second process of the host that asks first
		// is refused it.
		w := grab(t, dsn, "fo-a", []uint16{port(3)})
		if line := readLine(t, w); line != "refused "+p(port(3))+" "+strconv.Itoa(os.Getpid()) {
			t.Fatalf("a second process of fo-a asking for %d, lost in the failover, before its holder is back: %q; want refused, locked by pid %d", port(3), line, os.Getpid())
		}
		w.ready(t)
	}

	// The host registered last (its registration lost, asynchronously)
	// grants again at once, from its process that has its number cached:
	// a new connection registers it again. A call on a connection that
	// died with the old primary fails; the next one reconnects.
	deadline := promoted.Add(25 * time.Second)
	grantAgain := func(al *portalloc.Allocator) (time.Duration, int) {
		t.Helper()
		for failed := 0; ; failed++ {
			_, err := al.Allocate(ctx, portalloc.Request{Label: "after"})
			if err == nil {
				return time.Since(promoted), failed
			}
			if time.Now().After(deadline) {
				t.Fatalf("host %s: Allocate 25s after the promotion: %v", al.Config().Host, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	granted, failedC := grantAgain(cl)
	want = append(want, "fo-c:"+p(port(8)))
	slices.Sort(want)

	// The other holders are idle: they learn of the failover at their
	// next lease renewal (or their next call).
	for !slices.Equal(rows, want) {
		if time.Now().After(deadline) {
			t.Fatalf("rows 25s after the promotion = %v; want %v", rows, want)
		}
		time.Sleep(50 * time.Millisecond)
		rows, _ = hostRows(t, np)
	}
	back := time.Since(promoted)
	if got := numberOf(np); got != noC {
		t.Errorf("fo-c's number on the new primary = %d; want %d, the one its process has cached", got, noC)
	}

	failedAB := 0
	for _, al := range []*portalloc.Allocator{a, b} {
		_, failed := grantAgain(al)
		failedAB += failed
	}
	if lines := logA.find("could not be put back"); len(lines) != 0 {
		t.Errorf("fo-a logged ports it could not put back: %q; want none: no other process could take them", lines)
	}

	// Second processes of each host ask for the holders' ports: every one
	// is refused, naming this process; the ports released before the
	// failover and during it are granted.
	self := strconv.Itoa(os.Getpid())
	refused, grants := 0, 0
	for _, ask := range []struct {
		host  string
		ports []uint16
	}{{"fo-a", []uint16{port(0), port(1), port(2), port(3)}}, {"fo-b", []uint16{port(4), port(5), port(6)}}, {"fo-c", []uint16{port(7)}}} {
		w := grab(t, dsn, ask.host, ask.ports)
		for _, q := range ask.ports {
			got := strings.Fields(readLine(t, w))
			switch {
			case (q == port(1) || q == port(5)) && len(got) == 2 && got[0] == "granted":
				grants++
			case q != port(1) && q != port(5) && len(got) == 3 && got[0] == "refused" && got[2] == self:
				refused++
			default:
				t.Errorf("a second process of %s asking for %d: %q; want %s", ask.host, q, got,
					map[bool]string{true: "granted (its release was done again)", false: "refused, held by pid " + self}[q == port(1) || q == port(5)])
			}
		}
		w.ready(t)
	}

	st := []portalloc.Stats{a.Stats(), b.Stats(), cl.Stats()}
	restored, lost, rereleased := st[0].Restored+st[1].Restored+st[2].Restored, st[0].Lost+st[1].Lost+st[2].Lost, st[0].Rereleased+st[1].Rereleased+st[2].Rereleased
	// fo-b's release during the outage is done again either way; fo-a's,
	// lost with the last commits, and the three reservations lost with
	// them (a3, b6, c7) only asynchronously.
	wantRestored, wantLost, wantRereleased := int64(3), int64(0), int64(2)
	if sync {
		wantRestored, wantLost, wantRereleased = 0, 0, 1
	}
	if restored != wantRestored || lost != wantLost || rereleased != wantRereleased {
		t.Errorf("Stats: Restored %d, Lost %d, Rereleased %d; want %d, %d, %d", restored, lost, rereleased, wantRestored, wantLost, wantRereleased)
	}
	if err := a.Release(ctx, a3); err != nil {
		t.Errorf("fo-a's Release of the port it put back = %v", err)
	}
	t.Logf("sync=%v: fo-c (registered last) granting again %v after the promotion (%d calls failed first); every row back %v after it; "+
		"then fo-a and fo-b granting (%d calls failed first); second processes refused %d, granted %d; restored %d, not restored %d, released again %d",
		sync, granted.Round(time.Millisecond), failedC, back.Round(time.Millisecond), failedAB, refused, grants, restored, lost, rereleased)
}
