package portalloc_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/portalloc/fleet"
)

// The failover tests run a primary and a streaming standby of their own
// (initdb, pg_basebackup -R), on unix sockets only, as the unprivileged
// user .ci/postgres uses; berth reaches them through one multi-host
// connection string with target_session_attrs=read-write, as an operator's
// fleet does.

func init() {
	// A "grab" worker is a second process of host BERTH_TEST_HOST: it
	// asks for each port of BERTH_TEST_PORTS, prints "granted PORT" or
	// "refused PORT PID" (the holder's pid) for each, then "ready", and
	// holds what it was granted until stdin closes.
	workers["grab"] = func(ctx context.Context) error {
		a, err := fleet.New(ctx, portalloc.Config{StoreDSN: os.Getenv("BERTH_TEST_DSN"), Host: os.Getenv("BERTH_TEST_HOST"),
			StateDir: os.Getenv("BERTH_STATE_DIR"), Timeout: 20 * time.Second})
		if err != nil {
			return err
		}
		defer a.Close()
		for _, f := range strings.Split(os.Getenv("BERTH_TEST_PORTS"), ",") {
			p, _ := strconv.Atoi(f)
			_, err := a.Reserve(ctx, portalloc.Request{Label: "grab"}, uint16(p))
			var ce *portalloc.ConflictError
			switch {
			case err == nil:
				fmt.Println("granted", p)
			case errors.As(err, &ce):
				fmt.Println("refused", p, ce.Holder.Owner.PID)
			default:
				return err
			}
		}
		fmt.Println("ready")
		_, _ = os.Stdin.Read(make([]byte, 1))
		return nil
	}
}

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

// dsn is the fleet's connection string: both servers, the writable one.
func (c *pgPair) dsn() string { return c.DSN() }

func (c *pgPair) conn(tb testing.TB, sock string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), "host="+sock+" dbname=postgres user=postgres sslmode=disable")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// waitStreaming waits until the standby has replayed everything the
// primary wrote.
func (c *pgPair) waitStreaming(tb testing.TB) {
	tb.Helper()
	if err := c.WaitStreaming(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// holdBack stops the standby's WAL receiver: the primary's next commits
// do not reach it, as when replication lags.
func (c *pgPair) holdBack(tb testing.TB) {
	tb.Helper()
	s := c.conn(tb, c.sSock)
	defer s.Close(context.Background())
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

// kill kills the primary, as pg_ctl -m immediate does (SIGQUIT to the
// postmaster, SIGKILL after 5s): nothing is flushed or shipped any more.
func (c *pgPair) kill(tb testing.TB) {
	tb.Helper()
	if err := c.Primary.Stop(context.Background(), "immediate"); err != nil {
		tb.Fatal(err)
	}
}

// promote makes the standby the primary.
func (c *pgPair) promote(tb testing.TB) {
	tb.Helper()
	if err := c.Standby.Promote(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// hostRows returns the rows of the new primary as "host:port", sorted,
// and the hosts registered.
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
// received its last commits is promoted, while processes of two hosts hold
// ports (one bound, the others not yet) and a third host has just
// registered. The new primary lacks their latest reservations and the
// third host, and has back a row released just before. Without a restart:
// the holders put their rows back, the released row is released again,
// and once they have, no second process of their host is granted any of
// their ports; every host, the one whose registration was lost included,
// grants again.
func TestFailoverAsyncStandby(t *testing.T) { testFailover(t, false) }

// TestFailoverSyncStandby: the same with synchronous replication: nothing
// is lost at all, and nothing needs putting back.
func TestFailoverSyncStandby(t *testing.T) { testFailover(t, true) }

func testFailover(t *testing.T, sync bool) { //nolint:thelper // the body of the two tests above, not a helper
	ctx := context.Background()
	c := startPair(t, sync)
	dsn := c.dsn()
	base := freeRun(t, 16)
	port := func(i int) uint16 { return base + uint16(i) }
	// Reserved ports are base..base+7; Allocate draws from base+8...
	cfg := portalloc.Config{StoreDSN: dsn, Range: portalloc.Range{First: port(8), Last: port(15)}, AllowEphemeralOverlap: true,
		Order: portalloc.OrderLowest, Timeout: 20 * time.Second}
	hostA, hostB, hostC := cfg, cfg, cfg
	hostA.Host, hostB.Host, hostC.Host = "fo-a", "fo-b", "fo-c"
	var logA logCounter
	hostA.Logger = logA.logger()
	a := newAllocator(t, hostA)
	b := newAllocator(t, hostB)
	reserve := func(al *portalloc.Allocator, p uint16) portalloc.Reservation {
		t.Helper()
		r, err := al.Reserve(ctx, portalloc.Request{Label: "holder"}, p)
		if err != nil {
			t.Fatalf("Reserve(%d): %v", p, err)
		}
		return r
	}
	// Before the standby falls behind: a0 is bound, a1 is to be released,
	// a2 and b1 are not bound yet.
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
	c.waitStreaming(t)
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

	c.kill(t)
	// A release tried while no server takes writes fails.
	if err := b.Release(ctx, b5); !errors.Is(err, portalloc.ErrStoreUnavailable) {
		t.Fatalf("fo-b's Release while no primary runs = %v; want ErrStoreUnavailable", err)
	}
	c.promote(t)
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
	}

	// Asynchronously, a port lost with the last commits is free on the new
	// primary until its holder puts it back: a second process of the
	// host that asks first is granted it. The holder's putting back then
	// fails, and says so naming both processes.
	intruder := ""
	if !sync {
		w := spawn(t, "grab", "BERTH_TEST_DSN="+dsn, "BERTH_TEST_HOST=fo-a", "BERTH_STATE_DIR="+t.TempDir(), "BERTH_TEST_PORTS="+p(port(3)))
		if line, _ := w.out.ReadString('\n'); line != "granted "+p(port(3))+"\n" {
			t.Fatalf("a second process of fo-a asking for %d, lost in the failover, before its holder is back: %q; want granted", port(3), line)
		}
		w.ready(t)
		intruder = strconv.Itoa(w.cmd.Process.Pid)
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

	// Second processes of each host ask for the holders' ports: every one
	// is refused, naming this process; the ports released before the
	// failover and during it are granted.
	self := strconv.Itoa(os.Getpid())
	if !sync {
		lines := logA.find("could not be put back: another process took the port meanwhile")
		if len(lines) != 1 || !strings.Contains(lines[0], `"holder"="pid `+intruder) || !strings.Contains(lines[0], `"pid"=`+self) ||
			!strings.Contains(lines[0], p(port(3))) {
			t.Errorf("fo-a's log of the port it could not put back = %q; want one line naming %d, pid %s (the holder) and pid %s (the intruder)", lines, port(3), self, intruder)
		}
	}
	refused, grants := 0, 0
	for _, ask := range []struct {
		host  string
		ports []uint16
	}{{"fo-a", []uint16{port(0), port(1), port(2), port(3)}}, {"fo-b", []uint16{port(4), port(5), port(6)}}, {"fo-c", []uint16{port(7)}}} {
		var list []string
		for _, q := range ask.ports {
			list = append(list, p(q))
		}
		w := spawn(t, "grab", "BERTH_TEST_DSN="+dsn, "BERTH_TEST_HOST="+ask.host, "BERTH_STATE_DIR="+t.TempDir(), "BERTH_TEST_PORTS="+strings.Join(list, ","))
		for _, q := range ask.ports {
			line, err := w.out.ReadString('\n')
			if err != nil {
				t.Fatalf("grab worker of %s: %q, %v", ask.host, line, err)
			}
			got := strings.Fields(line)
			switch {
			case (q == port(1) || q == port(5)) && len(got) == 2 && got[0] == "granted":
				grants++
			case q == port(3) && !sync && len(got) == 3 && got[0] == "refused" && got[2] == intruder:
				refused++ // held by the process granted it during the failover
			case q != port(1) && q != port(5) && (q != port(3) || sync) && len(got) == 3 && got[0] == "refused" && got[2] == self:
				refused++
			default:
				t.Errorf("a second process of %s asking for %d: %q; want %s", ask.host, q, line,
					map[bool]string{true: "granted (its release was done again)", false: "refused, held by pid " + self}[q == port(1) || q == port(5)])
			}
		}
		w.ready(t)
	}

	st := []portalloc.Stats{a.Stats(), b.Stats(), cl.Stats()}
	restored, lost, rereleased := st[0].Restored+st[1].Restored+st[2].Restored, st[0].Lost+st[1].Lost+st[2].Lost, st[0].Rereleased+st[1].Rereleased
	// fo-b's release during the outage is done again either way; fo-a's,
	// lost with the last commits, only asynchronously.
	wantRestored, wantLost, wantRereleased := int64(2), int64(1), int64(2)
	if sync {
		wantRestored, wantLost, wantRereleased = 0, 0, 1
	}
	if restored != wantRestored || lost != wantLost || rereleased != wantRereleased {
		t.Errorf("Stats: Restored %d, Lost %d, Rereleased %d; want %d, %d, %d", restored, lost, rereleased, wantRestored, wantLost, wantRereleased)
	}
	if !sync {
		// fo-a still holds the port it could not put back (it tries again
		// at each comparison); its release finds no row of its own.
		if err := a.Release(ctx, a3); !errors.Is(err, portalloc.ErrNotHeld) && !strings.Contains(fmt.Sprint(err), "no such reservation") {
			t.Errorf("fo-a's Release of the port another process took during the failover = %v; want no such reservation", err)
		}
	}
	t.Logf("sync=%v: fo-c (registered last) granting again %v after the promotion (%d calls failed first); every row back %v after it; "+
		"then fo-a and fo-b granting (%d calls failed first); second processes refused %d, granted %d; restored %d, not restored %d, released again %d",
		sync, granted.Round(time.Millisecond), failedC, back.Round(time.Millisecond), failedAB, refused, grants, restored, lost, rereleased)
}

func p(port uint16) string { return strconv.Itoa(int(port)) }

// TestRetireLiveHost: retiring a host whose lease is live is refused,
// naming the host and when its lease ends, and deletes nothing; forced,
// it deletes the rows, and the host's live holder puts them back at its
// next lease renewal, after which a second process of the host is refused
// the ports.
func TestRetireLiveHost(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 2)
	a := newAllocator(t, portalloc.Config{StoreDSN: dsn, Host: "live-a", Range: portalloc.Range{First: base, Last: base + 1}, AllowEphemeralOverlap: true})
	for i := range 2 {
		if _, err := a.Reserve(ctx, portalloc.Request{Label: "live"}, base+uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	other, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: "live-b", SweepInterval: -1, LeaseTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	n, err := other.RetireHost(ctx, "live-a")
	var live *pgstore.HostLiveError
	if !errors.As(err, &live) || n != 0 || live.Host != "live-a" || live.Left <= 0 {
		t.Fatalf("RetireHost of a live host = %d, %v; want a *HostLiveError", n, err)
	}
	if rows, _ := expvarmetrics.ReadUsage(ctx, a); rows.Reserved != 2 {
		t.Fatalf("live-a's rows after a refused retirement = %d; want 2", rows.Reserved)
	}
	if n, err = other.Retire(ctx, "live-a", pgstore.RetireOptions{Force: true}); err != nil || n != 2 {
		t.Fatalf("Retire(live-a, Force) = %d, %v; want 2", n, err)
	}
	retired := time.Now()
	deadline := retired.Add(20 * time.Second)
	for {
		u, err := expvarmetrics.ReadUsage(ctx, a)
		if err == nil && u.Reserved == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("live-a's rows 20s after a forced retirement: %+v, %v; want its 2 back", u, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("live-a's holder put its 2 reservations back %v after the forced retirement", time.Since(retired).Round(time.Millisecond))
	if st := a.Stats(); st.Restored != 2 || st.Lost != 0 {
		t.Errorf("Stats after the forced retirement: Restored %d, Lost %d; want 2, 0", st.Restored, st.Lost)
	}
	w := spawn(t, "grab", "BERTH_TEST_DSN="+dsn, "BERTH_TEST_HOST=live-a", "BERTH_STATE_DIR="+t.TempDir(), "BERTH_TEST_PORTS="+p(base)+","+p(base+1))
	for range 2 {
		if line, _ := w.out.ReadString('\n'); !strings.HasPrefix(line, "refused ") {
			t.Errorf("a second process of live-a after the holder put its rows back: %q; want refused", line)
		}
	}
	w.ready(t)
}

// find returns the lines that contain phrase.
func (c *logCounter) find(phrase string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		if strings.Contains(l, phrase) {
			out = append(out, l)
		}
	}
	return out
}
