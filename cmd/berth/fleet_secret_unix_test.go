//go:build unix

package main

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/pgcluster"
	"github.com/berth-go/berth/internal/testports"
)

// secretPW is the password the fleet tests below give the server, put in
// every form of connection string, and look for in all berth prints.
const secretPW = "Sekr3t-PW-9f2"

// fleetEnv is the environment of a berth the tests below run: this
// process's, without BERTH_* and PGPASSWORD, on a state directory of the
// test's own and 50 ports of cmd/berth's block that the scripts and the
// other tests leave alone. Every port get hands out stays locked for this
// process on this machine, whichever host of the fleet it was for, until
// the test binary exits: TestFleetCommandsHideThePassword takes 24.
func fleetEnv(tb testing.TB, extra ...string) []string {
	tb.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BERTH_") && !strings.HasPrefix(kv, "PGPASSWORD=") {
			env = append(env, kv)
		}
	}
	last := testports.CmdBerth.Last
	return append(env, append([]string{
		"BERTH_STATE_DIR=" + tb.TempDir(),
		fmt.Sprintf("BERTH_PORT_RANGE=%d-%d", last-99, last-50),
		"BERTH_ALLOW_EPHEMERAL_OVERLAP=true",
		"NO_COLOR=1",
		"GORACE=atexit_sleep_ms=0", // see TestScripts
	}, extra...)...)
}

// berth runs the berth program (installed on PATH by TestMain) and
// returns what it printed on both outputs, how long it took, and its
// error.
func berth(env []string, args ...string) (string, time.Duration, error) {
	cmd := exec.Command("berth", args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	return out.String(), time.Since(start), err
}

// ownTime runs the berth program with args and returns, with its output
// and error, the command's own time: its run less how long the program
// takes to start and exit doing nothing (--version), which start returns.
// On a starved machine that cost is large and varies from one run to the
// next: it is measured just before the command and just after, and the
// larger taken off.
func ownTime(env []string, args ...string) (out string, own, start time.Duration, err error) {
	_, before, _ := berth(env, "--version")
	out, took, err := berth(env, args...)
	_, after, _ := berth(env, "--version")
	start = max(before, after)
	return out, took - start, start, err
}

// TestFleetCommandsFrozen: with every process of the fleet's PostgreSQL
// server stopped (SIGSTOP), get, ls, doctor, fleet ls and host retire each
// give up after --timeout and a small margin, saying which store did not
// answer (password hidden) and at which step.
func TestFleetCommandsFrozen(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	t0 := pgcluster.Guard(t, secretPW)
	c := pgcluster.Start(t)
	c.RequirePassword(t, secretPW)
	dsn := fmt.Sprintf("postgres://postgres:%s@/postgres?host=%s&sslmode=disable", secretPW, url.QueryEscape(c.Dir))
	env := fleetEnv(t, "BERTH_STORE="+dsn, "BERTH_HOST=frozen")
	if out, _, err := berth(env, "ls"); err != nil { // migrates the schema
		t0.Fatalf("berth ls: %v\n%s", err, out)
	}
	c.Freeze(t)
	const timeout = time.Second
	const margin = 2 * time.Second
	for _, args := range [][]string{
		{"get"}, {"ls"}, {"doctor"}, {"fleet", "ls"}, {"host", "retire", "other"}, {"get", "-vv"}, {"ls", "--log-level", "debug"},
	} {
		out, took, start, err := ownTime(env, append(args, "--timeout", timeout.String())...)
		t0.Logf("berth %s with the server frozen, after %v (and %v to start and exit):\n%s", strings.Join(args, " "), took.Round(time.Millisecond), start.Round(time.Millisecond), out)
		switch {
		case err == nil:
			t0.Errorf("berth %s with the server frozen succeeded; want an error", strings.Join(args, " "))
		case !strings.Contains(out, "connect to PostgreSQL store postgres://postgres:xxxxx@/postgres?host="):
			t0.Errorf("berth %s with the server frozen printed %q; want it to name the store, password hidden, and the connect that timed out", strings.Join(args, " "), out)
		case !strings.Contains(out, "gave up after --timeout 1s"):
			t0.Errorf("berth %s with the server frozen printed %q; want it to say it gave up after --timeout", strings.Join(args, " "), out)
		}
		if took > timeout+margin {
			t0.Errorf("berth %s with the server frozen took %v beyond the %v the program takes to start and exit; want at most --timeout %v and %v",
				strings.Join(args, " "), took, start, timeout, margin)
		}
		if strings.Contains(out, secretPW) {
			t0.Errorf("berth %s printed the password", strings.Join(args, " ")) // the guard hides it
		}
	}
	c.Thaw(t)
	if out, _, err := berth(env, "ls"); err != nil {
		t0.Errorf("berth ls once the server answers again: %v\n%s", err, out)
	}
}

// TestFleetCommandsHideThePassword: whatever form the connection string
// takes, given by --store or BERTH_STORE, and whether the server takes the
// password, refuses it, cannot be reached, or the scheme is mistyped,
// nothing get, ls, doctor or fleet ls print, at any log level, shows the
// password; a mistyped scheme is refused before any connection, naming
// the flag or variable.
func TestFleetCommandsHideThePassword(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	c := pgcluster.Start(t)
	c.RequirePassword(t, secretPW)
	sock := url.QueryEscape(c.Dir)
	runs, hosts := 0, 0
	for _, tc := range []struct {
		name, dsn  string
		pgpassword string // PGPASSWORD, when set
		ok         bool   // the commands work
		refused    string // what the refusal of the string says
	}{
		{name: "URL user information", dsn: "postgres://postgres:" + secretPW + "@/postgres?host=" + sock, ok: true},
		{name: "URL password parameter", dsn: "postgresql://postgres@/postgres?host=" + sock + "&password=" + secretPW, ok: true},
		{name: "key=value", dsn: c.DSN + " password=" + secretPW, ok: true},
		{name: "key=value quoted", dsn: c.DSN + " password = '" + secretPW + "'", ok: true},
		{name: "several hosts", dsn: "postgres://postgres:" + secretPW + "@/postgres?host=/nonexistent-dir," + sock, ok: true},
		{name: "PGPASSWORD", dsn: c.DSN, pgpassword: secretPW, ok: true},
		{name: "wrong password", dsn: "postgres://postgres:x" + secretPW + "@/postgres?host=" + sock},
		{name: "wrong password key=value", dsn: c.DSN + " password='x " + secretPW + "'"},
		{name: "wrong PGPASSWORD", dsn: c.DSN, pgpassword: "x" + secretPW},
		{name: "bad hosts", dsn: "postgres://postgres:" + secretPW + "@nohost.invalid:5432,otherhost.invalid:5433/postgres?connect_timeout=2"},
		{name: "mistyped scheme", dsn: "postgre://postgres:" + secretPW + "@/postgres?host=" + sock, refused: `its scheme "postgre://" is not "postgres://" or "postgresql://"`},
		{name: "upper-case scheme", dsn: "POSTGRES://postgres:" + secretPW + "@/postgres?host=" + sock, refused: `its scheme "POSTGRES://" must be in lower case`},
		{name: "misspelt key", dsn: c.DSN + " passwd=" + secretPW},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t1 := pgcluster.Guard(t, secretPW)
			var extra []string
			if tc.pgpassword != "" {
				extra = append(extra, "PGPASSWORD="+tc.pgpassword)
			}
			for _, via := range []string{"--store", "BERTH_STORE"} {
				// A host of its own: get gives its ports to this test,
				// which outlives the runs.
				hosts++
				env := fleetEnv(t, append(extra, fmt.Sprintf("BERTH_HOST=secretive-%d", hosts))...)
				var storeArgs []string
				if via == "--store" {
					storeArgs = []string{"--store", tc.dsn}
				} else {
					env = append(env, "BERTH_STORE="+tc.dsn)
				}
				for _, args := range [][]string{
					{"get"}, {"ls"}, {"doctor"}, {"fleet", "ls"}, {"get", "-vv"}, {"ls", "--log-level", "debug"}, {"doctor", "-v"},
				} {
					name := strings.Join(args, " ") // the store is named by via
					out, _, err := berth(env, append(append(args, storeArgs...), "--timeout", "5s")...)
					runs++
					if strings.Contains(out, secretPW) {
						t1.Errorf("berth %s (store by %s) printed the password:\n%s", name, via, out) // the guard hides it
					}
					if (err == nil) != tc.ok {
						t1.Errorf("berth %s (store by %s) = %v; want success %v:\n%s", name, via, err, tc.ok, out)
					}
					if tc.refused != "" {
						if want := via + `="`; via == "BERTH_STORE" && !strings.Contains(out, want) || via == "--store" && !strings.Contains(out, `--store "`) {
							t1.Errorf("berth %s (store by %s) printed %q; want the refusal to name %s", name, via, out, via)
						}
						if !strings.Contains(out, tc.refused) || !strings.Contains(out, "://postgres:xxxxx@/postgres") || !strings.Contains(out, "want a PostgreSQL connection string") {
							t1.Errorf("berth %s (store by %s) printed %q; want %q", name, via, out, tc.refused)
						}
					}
				}
			}
		})
	}
	t.Logf("%d runs of berth printed no password", runs)
}
