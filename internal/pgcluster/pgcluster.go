// Package pgcluster starts throwaway PostgreSQL clusters of a test's own,
// with the repository's .ci/postgres, for the tests that do to a server
// what would disturb the other tests of a shared one: freezing every
// process of it (SIGSTOP), as a partition or a hung machine looks from a
// client, or requiring a password.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testproc"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/internal/pgserver"
)

// EnvDSN is the variable that says a PostgreSQL server is at hand for
// tests; without it Start skips, as every fleet test does.
const EnvDSN = "BERTH_TEST_POSTGRES"

// Cluster is a running throwaway cluster.
type Cluster struct {
	// Dir holds the cluster (Dir/data) and its unix socket.
	Dir string
	// DSN connects to its postgres database as the postgres role, by the
	// unix socket, in key=value form.
	DSN    string
	frozen []int // the processes Freeze stopped and Thaw has not resumed
}

// Start starts a cluster of the test's own, stopped and deleted when the
// test ends. It skips the test when BERTH_TEST_POSTGRES is unset or no
// PostgreSQL is installed.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	if os.Getenv(EnvDSN) == "" {
		tb.Skipf("set %s to run the tests that need a PostgreSQL server (bash .ci/postgres start prints one)", EnvDSN)
	}
	script, err := ciScript()
	if err != nil {
		tb.Skipf("no .ci/postgres: %v", err)
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) == 0 {
		tb.Skip("no PostgreSQL server installed under /usr/lib/postgresql")
	}
	// A unix socket path is short: not under t.TempDir.
	dir, err := os.MkdirTemp("", "bpgc")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{Dir: dir}
	var stderr bytes.Buffer
	cmd := exec.Command("bash", script, "start", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		_ = os.RemoveAll(dir)
		tb.Fatalf("bash .ci/postgres start %s: %v\n%s", dir, err, stderr.Bytes())
	}
	c.DSN = strings.TrimSpace(string(out))
	tb.Cleanup(func() {
		c.thaw()
		stop := exec.Command("bash", script, "stop", dir)
		if out, err := stop.CombinedOutput(); err != nil {
			tb.Errorf("bash .ci/postgres stop %s: %v\n%s", dir, err, out)
		}
	})
	return c
}

// ciScript finds .ci/postgres in the module's root, above the working
// directory.
func ciScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, ".ci", "postgres")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not found above the working directory")
		}
		dir = parent
	}
}

// Freeze stops every process of the cluster with SIGSTOP: connections
// are accepted by the kernel and then never answered. The test's end
// resumes it. It skips the test where processes cannot be signalled.
func (c *Cluster) Freeze(tb testing.TB) {
	tb.Helper()
	pids, err := pgserver.Pids(filepath.Join(c.Dir, "data"))
	if err == nil && len(pids) == 0 {
		err = errors.New("the server does not run")
	}
	if err != nil {
		tb.Fatalf("the cluster's processes: %v", err)
	}
	for _, pid := range pids {
		if err := pgserver.StopProcess(pid); err != nil {
			c.thaw()
			tb.Skipf("cannot stop the server's process %d: %v", pid, err)
		}
		c.frozen = append(c.frozen, pid)
	}
	tb.Cleanup(c.thaw)
}

// Thaw resumes what Freeze stopped.
func (c *Cluster) Thaw(tb testing.TB) {
	tb.Helper()
	c.thaw()
}

func (c *Cluster) thaw() {
	// The postmaster (the first stopped) last.
	for i := len(c.frozen) - 1; i >= 0; i-- {
		_ = pgserver.ContinueProcess(c.frozen[i])
	}
	c.frozen = nil
}

// RequirePassword gives the postgres role password and makes the server
// require it (scram-sha-256) of every connection from then on.
func (c *Cluster) RequirePassword(tb testing.TB, password string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "SET password_encryption = 'scram-sha-256'"); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ALTER ROLE postgres PASSWORD '"+strings.ReplaceAll(password, "'", "''")+"'"); err != nil {
		tb.Fatal("set the role's password failed")
	}
	hba := filepath.Join(c.Dir, "data", "pg_hba.conf")
	if err := os.WriteFile(hba, []byte("local all all scram-sha-256\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		tb.Fatal(err)
	}
	// The reload is asynchronous: wait until a connection without the
	// password is refused.
	deadline := time.Now().Add(20 * time.Second)
	for {
		probe, err := pgx.Connect(ctx, c.DSN)
		if err != nil {
			return
		}
		_ = probe.Close(ctx)
		if time.Now().After(deadline) {
			tb.Fatal("the server still takes connections without a password 20s after pg_reload_conf")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Guard returns tb for a test that must never show secret: whatever the
// test reports through it has secret replaced by "<secret>", and a
// message that would have shown it fails the test.
func Guard(tb testing.TB, secret string) testing.TB {
	tb.Helper()
	return &guard{tb, secret}
}

type guard struct {
	testing.TB
	secret string
}

func (g *guard) clean(s string) string {
	if !strings.Contains(s, g.secret) {
		return s
	}
	g.Helper()
	g.TB.Error("a message of this test would have shown the password; it is hidden below")
	return strings.ReplaceAll(s, g.secret, "<secret>")
}

func (g *guard) Log(args ...any) { g.Helper(); g.TB.Log(g.clean(fmt.Sprint(args...))) }
func (g *guard) Logf(format string, args ...any) {
	g.Helper()
	g.TB.Log(g.clean(fmt.Sprintf(format, args...)))
}
func (g *guard) Error(args ...any) { g.Helper(); g.TB.Error(g.clean(fmt.Sprint(args...))) }
func (g *guard) Errorf(format string, args ...any) {
	g.Helper()
	g.TB.Error(g.clean(fmt.Sprintf(format, args...)))
}
func (g *guard) Fatal(args ...any) { g.Helper(); g.TB.Fatal(g.clean(fmt.Sprint(args...))) }
func (g *guard) Fatalf(format string, args ...any) {
	g.Helper()
	g.TB.Fatal(g.clean(fmt.Sprintf(format, args...)))
}
func (g *guard) Skip(args ...any) { g.Helper(); g.TB.Skip(g.clean(fmt.Sprint(args...))) }
func (g *guard) Skipf(format string, args ...any) {
	g.Helper()
	g.TB.Skip(g.clean(fmt.Sprintf(format, args...)))
}

// LogBuffer is a buffer for a logger the store's goroutines share, for a
// test to read what was logged. Its zero value is ready to use.
type LogBuffer = testproc.Buffer
