package portalloc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/internal/testproc"
)

// BenchmarkFleetContention runs 6 processes on each of 3 hosts of one
// fleet (network namespaces, Config.Host host-1..3) that allocate and
// release on the PostgreSQL store BERTH_TEST_POSTGRES names for two
// seconds, and reports their combined operations per second, the worst
// process's p99, the slowest single call, and the CPU time the server's
// processes (postmaster and backends) spent per operation. An operation is
// one Allocate+Release. It needs root and the server on this machine; it
// skips otherwise.
func BenchmarkFleetContention(b *testing.B) {
	const hosts, procs = 3, 6
	dsn := fleetDSN(b)
	nss := netns.ForTest(b, hosts)
	duration := 2 * time.Second
	for b.Loop() {
		var ps []*proc
		for h, ns := range nss {
			for range procs {
				cmd := testproc.Command(b, "churn")
				in := ns.Command(cmd.Path, cmd.Args[1:]...)
				in.Env = append(cmd.Env, "BERTH_TEST_DURATION="+duration.String(),
					"BERTH_TEST_STORE="+dsn, "BERTH_TEST_HOST="+fmt.Sprintf("host-%d", h+1), "BERTH_STATE_DIR="+b.TempDir())
				ps = append(ps, start(b, in).ready(b))
			}
		}
		cpu0 := serverCPU(b, dsn)
		churned := runChurn(b, ps)
		cpu := serverCPU(b, dsn) - cpu0
		churned.report(b, duration)
		b.ReportMetric(float64(cpu.Microseconds())/float64(max(churned.ops, 1)), "server-cpu-µs/op")
	}
}

// serverCPU is the CPU time (user and system) the PostgreSQL server dsn
// names has spent: its postmaster's own and that of its exited children
// (which the postmaster reaped), and that of its live children. A backend
// counted live at one reading and exited at the next is counted the same
// at both. It reads /proc, so the server must run on this machine; 10 ms
// resolution (USER_HZ 100).
func serverCPU(tb testing.TB, dsn string) time.Duration {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	var backend int
	err = conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := procStat(backend)
	// Its backend exits, and its time joins the postmaster's children's.
	_ = conn.Close(ctx)
	if err != nil {
		tb.Skipf("the server runs elsewhere: %v", err)
	}
	pm := int(st[1]) // ppid
	var ticks int64
	if st, err = procStat(pm); err != nil {
		tb.Fatal(err)
	}
	ticks += st[11] + st[12] + st[13] + st[14] // utime stime cutime cstime
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		if st, err := procStat(pid); err == nil && st[1] == int64(pm) {
			ticks += st[11] + st[12]
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// procStat returns the numeric fields of /proc/PID/stat after the command
// name: index 0 is field 3 (state, as 0), 1 the ppid, 11-14 utime, stime,
// cutime, cstime.
func procStat(pid int) ([]int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	out := make([]int64, len(f))
	for i, x := range f {
		out[i], _ = strconv.ParseInt(x, 10, 64)
	}
	if len(out) < 15 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(out))
	}
	return out, nil
}
