package fleet_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/store"
)

// The failover tests run a primary and a streaming standby of their own
// (initdb, pg_basebackup -R), on unix sockets only, as the unprivileged
// user .ci/postgres uses; berth reaches them through one multi-host
// connection string with target_session_attrs=read-write, as an operator's
// fleet does.

func init() {
	// A "grab" worker is a second process of the host BERTH_HOST on the
	// store BERTH_STORE: it asks for each port of BERTH_TEST_PORTS, prints
	// "granted PORT" or "refused PORT PIDS" (the pids holding the port,
	// by its row or its lock) for each, then "ready", and holds what it
	// was granted until stdin closes.
	testproc.Register("grab", func() int {
		ctx := context.Background()
		a, err := fleet.New(ctx, portalloc.Config{Timeout: 20 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer a.Close()
		for _, f := range strings.Split(os.Getenv("BERTH_TEST_PORTS"), ",") {
			p, _ := strconv.Atoi(f)
			_, err := a.Reserve(ctx, portalloc.Request{Label: "grab"}, uint16(p))
			var ce *store.ConflictError
			switch {
			case err == nil:
				fmt.Println("granted", p)
			case errors.As(err, &ce):
				pids := slices.Clone(ce.PIDs)
				if ce.Holder.Owner.PID != 0 {
					pids = append(pids, ce.Holder.Owner.PID)
				}
				var s []string
				for _, pid := range pids {
					s = append(s, strconv.Itoa(pid))
				}
				fmt.Println("refused", p, strings.Join(s, ","))
			default:
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	})
}

// grab starts a "grab" worker of host on dsn for ports and returns its
// answers, one line per port, once it is ready; it holds what it was
// granted until the test ends.
func grab(tb testing.TB, dsn, host string, rng store.Range, ports ...uint16) []string {
	tb.Helper()
	var list []string
	for _, p := range ports {
		list = append(list, strconv.Itoa(int(p)))
	}
	cmd := testproc.Command(tb, "grab")
	cmd.Env = append(cmd.Env, "BERTH_STORE="+dsn, "BERTH_HOST="+host, "BERTH_STATE_DIR="+tb.TempDir(),
		"BERTH_PORT_RANGE="+rng.String(), "BERTH_TEST_PORTS="+strings.Join(list, ","))
	stdin, stdout := testproc.Start(tb, cmd)
	tb.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	out := bufio.NewReader(stdout)
	var lines []string
	for {
		line, err := out.ReadString('\n')
		if err != nil {
			tb.Fatalf("grab worker of %s: %q, %v", host, lines, err)
		}
		line = strings.TrimSpace(line)
		if line == "ready" {
			return lines
		}
		lines = append(lines, line)
	}
}

// startPair makes and starts a primary and a standby streaming from it;
// with sync the primary waits for the standby at every commit
// (synchronous_standby_names). Both are stopped and deleted when tb ends,
// whatever happened.
func startPair(tb testing.TB, sync bool) *pgserver.Pair {
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
	return pair
}

func connect(tb testing.TB, s *pgserver.Server) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), s.DSN())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// holdBack stops the standby's WAL receiver: the primary's next commits
// do not reach it, as when replication lags.
func holdBack(tb testing.TB, standby *pgserver.Server) {
	tb.Helper()
	s := connect(tb, standby)
	ctx := context.Background()
	for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := s.Exec(ctx, q); err != nil {
			tb.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
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

// hostRows returns the rows of a server as "host:port", sorted, and the
// hosts registered.
func hostRows(tb testing.TB, conn *pgx.Conn) (rows, hosts []string) {
	tb.Helper()
	ctx := context.Background()
	r, err := conn.Query(ctx, "SELECT h.host_id || ':' || p.port FROM berth_port_allocations p JOIN berth_hosts h USING (host_no) ORDER BY 1")
	if err != nil {
		tb.Fatal(err)
	}
	if rows, err = pgx.CollectRows(r, pgx.RowTo[string]); err != nil {
		tb.Fatal(err)
	}
	r, err = conn.Query(ctx, "SELECT host_id FROM berth_hosts ORDER BY 1")
	if err != nil {
		tb.Fatal(err)
	}
	if hosts, err = pgx.CollectRows(r, pgx.RowTo[string]); err != nil {
		tb.Fatal(err)
	}
	return rows, hosts
}

// replayed waits until the standby conn is on has replayed all the WAL
// it received.
func replayed(tb testing.TB, conn *pgx.Conn) {
	tb.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var done bool
		if err := conn.QueryRow(context.Background(), "SELECT coalesce(pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn(), true)").Scan(&done); err != nil {
			tb.Fatal(err)
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("the standby has not replayed the WAL it received after 30s")
		}
	}
}

func p(port uint16) string { return strconv.Itoa(int(port)) }

// TestFailoverAsyncStandby: the primary dies and a standby that had not
// received its last commits is promoted, while processes of two hosts hold
// ports (one bound, the others not yet) and a third host has just
// registered. The new primary lacks their latest reservations and the
// third host, and has back a row released just before. Without a restart:
// a second process of a host that asks for a port whose row was lost is
// refused all the same (its holder's lock keeps it), the holders put
// their rows back, the released row is released again, and every host,
// the one whose registration was lost included, grants again.
func TestFailoverAsyncStandby(t *testing.T) { testFailover(t, false) }

// TestFailoverSyncStandby: the same with synchronous replication: nothing
// is lost at all, and nothing needs putting back.
func TestFailoverSyncStandby(t *testing.T) { testFailover(t, true) }

func testFailover(t *testing.T, sync bool) { //nolint:thelper // the body of the two tests above
	ctx := context.Background()
	base := freeRun(t, 16)
	pair := startPair(t, sync)
	dsn := pair.DSN()
	port := func(i int) uint16 { return base + uint16(i) }
	// Reserved ports are base..base+7; Allocate draws from base+8...
	rng := store.Range{First: port(8), Last: port(15)}
	cfg := portalloc.Config{StoreDSN: dsn, Range: rng, Order: portalloc.OrderLowest, Timeout: 20 * time.Second}
	hostA, hostB, hostC := cfg, cfg, cfg
	hostA.Host, hostB.Host, hostC.Host = "fo-a", "fo-b", "fo-c"
	var logA testproc.Buffer
	hostA.Logger = portalloc.TextLogger(&logA, slog.LevelInfo)
	a := newFleet(t, hostA)
	b := newFleet(t, hostB)
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
	if err := pair.WaitStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	if !sync {
		holdBack(t, pair.Standby)
	}
	// Commits the standby of the asynchronous setup never receives.
	a3 := reserve(a, port(3))
	reserve(b, port(6))
	if err := a.Release(ctx, a1); err != nil {
		t.Fatal(err)
	}
	cl := newFleet(t, hostC)
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
	noC := numberOf(connect(t, pair.Primary))

	// The primary dies as in a crash: nothing more is flushed or shipped.
	if err := pair.Primary.Stop(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	// A release tried while no server takes writes fails; it is done
	// again once one does.
	if err := b.Release(ctx, b5); !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, store.ErrStorage) {
		t.Fatalf("fo-b's Release while no primary runs = %v; want the store unavailable", err)
	}
	// What the standby will have once promoted, read before any host can
	// write to it: the hosts reconnect as soon as it is promoted, and put
	// back and release again what the failover lost.
	np := connect(t, pair.Standby)
	replayed(t, np)
	rows, hosts := hostRows(t, np)
	if err := pair.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	if sync {
		all := append(slices.Clone(want), "fo-b:"+p(port(5))) // its release failed
		slices.Sort(all)
		if !slices.Equal(rows, all) || !slices.Contains(hosts, "fo-c") {
			t.Fatalf("rows on the synchronous standby = %v, hosts %v; want %v and fo-c: nothing lost", rows, hosts, all)
		}
	} else {
		lostWant := []string{"fo-a:" + p(port(0)), "fo-a:" + p(port(1)), "fo-a:" + p(port(2)), "fo-b:" + p(port(4)), "fo-b:" + p(port(5))}
		slices.Sort(lostWant)
		if !slices.Equal(rows, lostWant) || slices.Contains(hosts, "fo-c") {
			t.Fatalf("rows on the asynchronous standby = %v, hosts %v; want %v without fo-c: the test did not lose the last commits", rows, hosts, lostWant)
		}
	}
	self := strconv.Itoa(os.Getpid())

	// A port whose row was lost with the last commits is still locked by
	// its holder: a second process of the host that asks for it before
	// the holder has put its row back is refused, and leaves no row.
	if !sync {
		got := grab(t, dsn, "fo-a", rng, port(3))
		if len(got) != 1 || !strings.HasPrefix(got[0], "refused "+p(port(3))) {
			t.Errorf("a second process of fo-a asking for %d, lost in the failover: %q; want refused by its holder's lock", port(3), got)
		}
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
	// next lease renewal (or their next call), and put back what they
	// hold, and release again what they released.
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
	if strings.Contains(logA.String(), "could not be put back") {
		t.Errorf("fo-a logged ports it could not put back; want none: no other process could take them. Its log:\n%s", logA.String())
	}

	// Second processes of each host ask for the holders' ports: every one
	// is refused, naming this process; the ports released before the
	// failover and during it are granted.
	refused, grants := 0, 0
	for _, ask := range []struct {
		host  string
		ports []uint16
	}{{"fo-a", []uint16{port(0), port(1), port(2), port(3)}}, {"fo-b", []uint16{port(4), port(5), port(6)}}, {"fo-c", []uint16{port(7)}}} {
		lines := grab(t, dsn, ask.host, rng, ask.ports...)
		if len(lines) != len(ask.ports) {
			t.Fatalf("grab worker of %s: %q; want a line for each of %v", ask.host, lines, ask.ports)
		}
		for i, q := range ask.ports {
			got := strings.Fields(lines[i])
			switch released := q == port(1) || q == port(5); {
			case released && len(got) == 2 && got[0] == "granted":
				grants++
			case !released && len(got) == 3 && got[0] == "refused" && slices.Contains(strings.Split(got[2], ","), self):
				refused++
			default:
				t.Errorf("a second process of %s asking for %d: %q; want %s", ask.host, q, lines[i],
					map[bool]string{true: "granted (its release was done again)", false: "refused, held by pid " + self}[released])
			}
		}
	}

	st := []portalloc.Stats{a.Stats(), b.Stats(), cl.Stats()}
	// One store per host: each host's counters count once.
	restored, lost, rereleased := st[0].Restored+st[1].Restored+st[2].Restored, st[0].Lost+st[1].Lost+st[2].Lost, st[0].Rereleased+st[1].Rereleased+st[2].Rereleased
	// fo-b's release during the outage is done again either way; fo-a's,
	// lost with the last commits, only asynchronously. Asynchronously the
	// grants a3, b6 and c7 are put back.
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

// TestRetireLiveHost: retiring a host whose lease is live is refused,
// naming the host, and deletes nothing; forced, it deletes the rows, and
// the host's live holder puts them back at its next lease renewal, after
// which a second process of the host is refused the ports.
func TestRetireLiveHost(t *testing.T) {
	dsn, conn := fleetDSN(t)
	ctx := context.Background()
	base := freeRun(t, 2)
	rng := store.Range{First: base, Last: base + 1}
	a := newFleet(t, portalloc.Config{StoreDSN: dsn, Host: "live-a", Range: rng})
	for i := range 2 {
		if _, err := a.Reserve(ctx, portalloc.Request{Label: "live"}, base+uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	other, err := fleet.Open(ctx, portalloc.Config{StoreDSN: dsn, Host: "live-b", IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	n, err := other.Retire(ctx, "live-a", pgstore.RetireOptions{})
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "host" || fe.Value != "live-a" || n != 0 || !strings.Contains(err.Error(), "holds a live lease") {
		t.Fatalf("Retire of a live host = %d, %v; want live-a refused for its live lease", n, err)
	}
	mine := []string{row("live-a", base, os.Getpid()), row("live-a", base+1, os.Getpid())}
	if got := rows(t, conn); !slices.Equal(got, mine) {
		t.Fatalf("rows after a refused retirement = %v; want %v", got, mine)
	}
	if n, err = other.Retire(ctx, "live-a", pgstore.RetireOptions{Force: true}); err != nil || n != 2 {
		t.Fatalf("Retire(live-a, Force) = %d, %v; want 2", n, err)
	}
	if got := rows(t, conn); len(got) != 0 {
		t.Fatalf("rows after the forced retirement = %v; want none", got)
	}
	retired := time.Now()
	// The holder learns of it at its next renewal of the host's lease,
	// within a third of the lease (30s).
	for deadline := retired.Add(20 * time.Second); !slices.Equal(rows(t, conn), mine); {
		if time.Now().After(deadline) {
			t.Fatalf("rows 20s after a forced retirement = %v; want live-a's %v back", rows(t, conn), mine)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("live-a's holder put its 2 reservations back %v after the forced retirement", time.Since(retired).Round(time.Millisecond))
	if st := a.Stats(); st.Restored != 2 || st.Lost != 0 {
		t.Errorf("Stats after the forced retirement: Restored %d, Lost %d; want 2, 0", st.Restored, st.Lost)
	}
	self := strconv.Itoa(os.Getpid())
	for _, line := range grab(t, dsn, "live-a", rng, base, base+1) {
		if f := strings.Fields(line); len(f) != 3 || f[0] != "refused" || !slices.Contains(strings.Split(f[2], ","), self) {
			t.Errorf("a second process of live-a after the holder put its rows back: %q; want refused, naming pid %s", line, self)
		}
	}
}
