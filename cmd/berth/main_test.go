package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// The scripts in testdata/script run berth as a real program: testscript
// installs this test binary as "berth" on PATH, so "exec berth" and a shell
// script calling berth both start a process of their own.
func TestMain(m *testing.M) {
	commands["berth"] = func() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) }
	commands["berth-testserver"] = func() { os.Exit(testServer(os.Args[1:])) }
	testscript.Main(m, commands)
}

// commands are the programs this test binary also is, by name (TestMain);
// platform files add theirs.
var commands = map[string]func(){}

// Each script runs on a state directory of its own, in parallel with the
// others, and berth doctor binds every port of its range: so each script
// gets a block of its own of this package's ports (internal/testports), by
// its place among the scripts. The first 56 ports of the block are its
// BERTH_PORT_RANGE; the last 10 are $PORT0 to $PORT9, for the ports a
// script names itself, which berth get never hands out.
const (
	blockSize = 66
	portVars  = 10
)

func TestScripts(t *testing.T) {
	testports.Hold(t, testports.CmdBerth)
	waitUnlocked(t, testports.CmdBerth)
	entries, err := os.ReadDir("testdata/script")
	if err != nil {
		t.Fatal(err)
	}
	block := map[string]int{} // script-NAME, as testscript names the work directory
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".txtar")
		if !ok {
			name, ok = strings.CutSuffix(e.Name(), ".txt")
		}
		if ok {
			block["script-"+name] = len(block)
		}
	}
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			env.Setenv("BERTH_STATE_DIR", env.WorkDir+"/state")
			// A named holder's locks outlive the script, held by its keeper
			// until the lease ends: a script that fails before it releases
			// them would leave its ports locked for the next run.
			env.Defer(func() { dropHolderLocks(env.WorkDir + "/state") })
			env.Setenv("NO_COLOR", "1")
			// Under -race each berth the scripts run would sleep a second
			// as it exits, for goroutines that still run to race: the
			// scripts run berth hundreds of times. A race while berth runs
			// is reported all the same.
			env.Setenv("GORACE", "atexit_sleep_ms=0")
			env.Setenv("SCHEMA_VERSION", fmt.Sprint(statestore.SchemaVersion))
			i, ok := block[filepath.Base(env.WorkDir)]
			if !ok {
				return fmt.Errorf("no block of ports for work directory %s", env.WorkDir)
			}
			first := int(testports.CmdBerth.First) + i*blockSize
			if first+blockSize-1 > int(testports.CmdBerth.Last) {
				return fmt.Errorf("%d scripts need %d ports; widen cmd/berth's range %v in internal/testports", len(block), len(block)*blockSize, testports.CmdBerth)
			}
			env.Setenv("BERTH_PORT_RANGE", fmt.Sprintf("%d-%d", first, first+blockSize-portVars-1))
			for j := range portVars {
				env.Setenv(fmt.Sprintf("PORT%d", j), strconv.Itoa(first+blockSize-portVars+j))
			}
			if base := os.Getenv("BERTH_TEST_POSTGRES"); base != "" {
				dsn, err := fleetSchema(env, base)
				if err != nil {
					return err
				}
				env.Setenv("FLEET_STORE", dsn)
			}
			return nil
		},
		// [fleet]: a PostgreSQL server is at hand (BERTH_TEST_POSTGRES).
		// [netns]: network namespaces can be made here, to stand in for
		// the hosts of a fleet (see hostns).
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "fleet":
				return os.Getenv("BERTH_TEST_POSTGRES") != "", nil
			case "netns":
				return netnsWork(), nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"jsonrows": jsonRows,
			"rawrow":   rawRow,
			"hostns":   hostNS,
		},
	})
}

// waitUnlocked waits until no berth lock of a port of r is held on this
// host. The scripts' ports belong to this test binary, and the keepers
// that hold their locks let go of them once they see it exit: for an
// earlier run of these tests, a few milliseconds after the range was
// handed over. After ten seconds it logs what is still locked, and the
// scripts go on; those whose ports are locked fail, saying so.
func waitUnlocked(tb testing.TB, r testports.Range) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, err := portlock.List()
		if err != nil {
			return
		}
		var in []string
		for _, l := range held {
			if l.Port >= r.First && l.Port <= r.Last {
				in = append(in, fmt.Sprintf("%s %d (pids %v)", l.Network, l.Port, l.PIDs))
			}
		}
		if len(in) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Logf("ports of %v still locked after 10s, by another run's keepers or another program (berth who PORT shows which): %s", r, strings.Join(in, ", "))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jsonrows [-nolocks] FILE N [FIELD=VALUE...] parses FILE as a JSON array
// and checks that it has N elements, each with the given fields. -nolocks
// leaves out the elements of kind "lock" first: berth ls lists the locks of
// every berth process of the host, those of the scripts that run alongside
// included.
func jsonRows(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "usage: jsonrows [-nolocks] FILE N [FIELD=VALUE...]"
	noLocks := len(args) > 0 && args[0] == "-nolocks"
	if noLocks {
		args = args[1:]
	}
	if neg || len(args) < 2 {
		ts.Fatalf(usage)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &rows); err != nil {
		ts.Fatalf("%s is not a JSON array: %v", args[0], err)
	}
	if noLocks {
		rows = slices.DeleteFunc(rows, func(r map[string]any) bool { return r["kind"] == "lock" })
	}
	n, _ := strconv.Atoi(args[1])
	if len(rows) != n {
		ts.Fatalf("%s has %d rows; want %d", args[0], len(rows), n)
	}
	for _, kv := range args[2:] {
		k, v, _ := cut(kv)
		for i, r := range rows {
			if got := fmt.Sprint(r[k]); got != v {
				ts.Fatalf("row %d: %s = %q; want %q", i, k, got, v)
			}
		}
	}
}

// rawrow [-repeat N] PORT LABEL [NAME] inserts a row straight into the
// state store of $BERTH_STATE_DIR (created first if need be), as an older
// berth, another program or a hand with sqlite3 could: tcp 127.0.0.1:PORT,
// labelled LABEL (repeated N times), owned by process NAME, pid 99999999,
// which never runs (pid_max is at most 4194304), so the row is dead. LABEL
// and NAME are Go string literals ("\x1b[31m"), so that any bytes can be
// written. The row was created ten and a half days ago, so that its age
// shows as "10d" even if a test elsewhere steps the clock meanwhile.
func rawRow(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "usage: rawrow [-repeat N] PORT LABEL [NAME]"
	if neg {
		ts.Fatalf(usage)
	}
	repeat := 1
	if len(args) > 2 && args[0] == "-repeat" {
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 {
			ts.Fatalf("%s: -repeat %q", usage, args[1])
		}
		repeat, args = n, args[2:]
	}
	if len(args) < 2 || len(args) > 3 {
		ts.Fatalf(usage)
	}
	port, err := strconv.ParseUint(args[0], 10, 16)
	if err != nil {
		ts.Fatalf("%s: PORT %q", usage, args[0])
	}
	unquote := func(s string) string {
		u, err := strconv.Unquote(s)
		if err != nil {
			ts.Fatalf("%s: %s is not a Go string literal: %v", usage, s, err)
		}
		return u
	}
	label := strings.Repeat(unquote(args[1]), repeat)
	name := "sh"
	if len(args) == 3 {
		name = unquote(args[2])
	}
	self, err := store.Self()
	ts.Check(err)
	path := filepath.Join(ts.Getenv("BERTH_STATE_DIR"), databaseFile)
	ctx := context.Background()
	st, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	ts.Check(err)
	ts.Check(st.Close())
	db, err := sql.Open("sqlite", path)
	ts.Check(err)
	defer db.Close()
	_, err = db.ExecContext(ctx, `INSERT INTO port_allocations
		(protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind, created_at)
		VALUES ('tcp', ?, ?, 99999999, 1, ?, ?, ?, 'dynamic', ?)`,
		port, []byte{127, 0, 0, 1}, self.Namespace, name, label, time.Now().Add(-252*time.Hour).UnixNano())
	ts.Check(err)
}

// dropHolderLocks has the keepers of the named holders of the store in dir
// let go of the locks of their rows there.
func dropHolderLocks(dir string) {
	path := filepath.Join(dir, databaseFile)
	if _, err := os.Stat(path); err != nil {
		return
	}
	ctx := context.Background()
	st, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		return
	}
	defer st.Close()
	rows, err := st.List(ctx, store.Filter{})
	if err != nil {
		return
	}
	for _, r := range rows {
		if r.Owner.Holder != "" {
			_, _ = portlock.HolderKeeper(r.Owner.Holder).Drop(string(r.Protocol), r.Addr, r.Port)
		}
	}
}

// netnsWork reports whether network namespaces can be made here (Linux,
// root, ip(8) on PATH), by making one.
var netnsWork = sync.OnceValue(func() bool {
	if _, err := exec.LookPath("ip"); err != nil {
		return false // the scripts run "ip netns exec"
	}
	_, remove, err := netns.AddN(context.Background(), fmt.Sprintf("berth-cli-%d-probe", os.Getpid()), 1)
	return err == nil && remove() == nil
})

// hostns add VAR makes a network namespace with its loopback up, for a
// host of a fleet other than this machine: its ports and its berth
// processes' locks are its own, as another machine's are, while the file
// system, the processes and the PostgreSQL server are shared. VAR is set to
// its name, for "exec ip netns exec $VAR berth ...". It is deleted, every
// process in it killed, when the script ends.
//
// hostns down VAR kills every process in VAR's namespace (its berth
// processes' keepers): the host is gone for good.
func hostNS(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 || (args[0] != "add" && args[0] != "down") {
		ts.Fatalf("usage: hostns add|down VAR")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	none := func(int) bool { return false }
	if args[0] == "down" {
		_, err := netns.NS{Name: ts.Getenv(args[1])}.KillAll(ctx, none)
		ts.Check(err)
		return
	}
	prefix := fmt.Sprintf("berth-cli-%d-%s-%s", os.Getpid(), filepath.Base(ts.Getenv("WORK")), args[1])
	nss, remove, err := netns.AddN(ctx, prefix, 1)
	ts.Check(err)
	ts.Defer(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = nss[0].KillAll(ctx, none)
		_ = remove()
	})
	ts.Setenv(args[1], nss[0].Name)
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// fleetSchema makes a schema of the script's own on the server base names,
// dropped when the script ends, and returns a DSN that works in it.
func fleetSchema(env *testscript.Env, base string) (string, error) {
	dsn, drop, err := pgschema.Create(context.Background(), base, "berth_cli")
	if err != nil {
		return "", fmt.Errorf("BERTH_TEST_POSTGRES: %w", err)
	}
	env.Defer(func() { _ = drop() })
	return dsn, nil
}
