// Package pgserver runs throwaway PostgreSQL servers of a program's own
// (a test's, or the torture harness's) with the binaries installed under
// /usr/lib/postgresql: one cluster, or a primary with a streaming standby
// that can fail over again and again. Servers listen on unix sockets only,
// trust every local connection and run without fsync: they are for tests
// and nothing else. Run as root, every program runs as the OS user
// postgres, since PostgreSQL refuses to run as root.
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotInstalled: no PostgreSQL server binaries under /usr/lib/postgresql.
var ErrNotInstalled = errors.New("no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) under /usr/lib/postgresql; bash .ci/postgres start installs them")

// ErrNoUser: this is root, and there is no OS user postgres.
var ErrNoUser = errors.New("running as root without an OS user postgres to run PostgreSQL as (bash .ci/postgres start creates it)")

// maxRoot bounds the length of a cluster's directory: a unix socket's
// path has about 100 bytes.
const maxRoot = 80

// Bin returns the directory of the newest installed PostgreSQL's
// programs, or an error wrapping ErrNotInstalled.
func Bin() (string, error) {
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	// Order the versions as numbers: 9 before 16.
	slices.SortFunc(m, func(a, b string) int { return version(a) - version(b) })
	for i := len(m) - 1; i >= 0; i-- {
		dir := filepath.Dir(m[i])
		if ok(filepath.Join(dir, "pg_ctl")) && ok(filepath.Join(dir, "pg_basebackup")) {
			return dir, nil
		}
	}
	return "", ErrNotInstalled
}

func ok(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&0o111 != 0
}

// version is V in /usr/lib/postgresql/V/bin/...
func version(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

// Cluster is a directory of servers, all run as one OS user.
type Cluster struct {
	// Root holds every server's data and socket directories and logs.
	Root   string
	bin    string
	asUser []string // the command prefix that runs a program as the servers' user
	uid    int      // the servers' user, when not this one; -1 otherwise
	// MaxConnections is every server's max_connections; zero: 200.
	MaxConnections int
	// Sync makes the primary of StartPair, and each one Failover
	// promotes, wait at every commit for a standby to have flushed it.
	Sync    bool
	servers []*Server
}

// New makes root (absent or empty) for servers of this process's user,
// or of postgres when it is root.
func New(root string) (*Cluster, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if len(root) > maxRoot {
		return nil, fmt.Errorf("pgserver: %s is too long for a unix socket's directory (at most %d bytes)", root, maxRoot)
	}
	c := &Cluster{Root: root, bin: bin, uid: -1}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, ErrNoUser
		}
		if c.uid, err = strconv.Atoi(u.Uid); err != nil {
			return nil, fmt.Errorf("pgserver: the uid of postgres: %w", err)
		}
		c.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	if err := c.mkdir(root); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) mkdir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("pgserver: %w", err)
	}
	if c.uid >= 0 {
		if err := os.Chown(dir, c.uid, -1); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, prog string, args ...string) error {
	argv := append(slices.Clone(c.asUser), append([]string{filepath.Join(c.bin, prog)}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgserver: %s %s: %w\n%s", prog, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Server is one server of a Cluster.
type Server struct {
	c    *Cluster
	Name string
	// Data is its data directory, Sock its unix socket's, Log its log file.
	Data, Sock, Log string
	sync            bool // started as the synchronous primary of a Pair
}

// Server returns c's server name (data in Root/name, socket in Root/name.s), not started.
func (c *Cluster) Server(name string) (*Server, error) {
	s := &Server{c: c, Name: name, Data: filepath.Join(c.Root, name), Sock: filepath.Join(c.Root, name+".s"),
		Log: filepath.Join(c.Root, name+".log")}
	if err := c.mkdir(s.Sock); err != nil {
		return nil, err
	}
	c.servers = append(c.servers, s)
	return s, nil
}

// DSN connects to s alone, as the postgres role, in key=value form.
func (s *Server) DSN() string {
	return "host=" + s.Sock + " dbname=postgres user=postgres sslmode=disable"
}

// InitDB makes s's cluster.
func (s *Server) InitDB(ctx context.Context) error {
	return s.c.run(ctx, "initdb", "-D", s.Data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
}

// BaseBackup makes s a standby of from (pg_basebackup -R).
func (s *Server) BaseBackup(ctx context.Context, from *Server) error {
	if err := os.RemoveAll(s.Data); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return s.c.run(ctx, "pg_basebackup", "-D", s.Data, "-h", from.Sock, "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync")
}

// A standby that finds no WAL to replay looks again after 100ms, not 5s, so a promotion does not wait.
func (s *Server) options() string {
	n := s.c.MaxConnections
	if n <= 0 {
		n = 200
	}
	o := fmt.Sprintf("-c listen_addresses='' -c unix_socket_directories='%s' -c fsync=off -c full_page_writes=off -c max_connections=%d -c wal_retrieve_retry_interval=100ms", s.Sock, n)
	if s.sync {
		o += " -c synchronous_standby_names='*' -c synchronous_commit=on"
	}
	return o
}

// Start starts s and waits until it takes connections.
func (s *Server) Start(ctx context.Context) error {
	return s.c.run(ctx, "pg_ctl", "-D", s.Data, "-l", s.Log, "-w", "-t", "60", "-o", s.options(), "start")
}

// Stop stops s in mode (smart, fast or immediate), if it runs.
func (s *Server) Stop(ctx context.Context, mode string) error {
	if _, err := os.Stat(filepath.Join(s.Data, "postmaster.pid")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return s.c.run(ctx, "pg_ctl", "-D", s.Data, "-m", mode, "-w", "-t", "60", "stop")
}

// Restart stops s in mode (fast: every session ended, everything
// flushed; immediate: as a crash) and starts it again.
func (s *Server) Restart(ctx context.Context, mode string) error {
	return s.c.run(ctx, "pg_ctl", "-D", s.Data, "-l", s.Log, "-m", mode, "-w", "-t", "60", "-o", s.options(), "restart")
}

// Promote makes the standby s a primary and waits until it is.
func (s *Server) Promote(ctx context.Context) error {
	return s.c.run(ctx, "pg_ctl", "-D", s.Data, "-w", "-t", "60", "promote")
}

// Pids is Pids of s's data directory.
func (s *Server) Pids() ([]int, error) { return Pids(s.Data) }

// Pids returns the postmaster of the data directory data and the
// processes it started; none when it does not run.
func Pids(data string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("pgserver: %s/postmaster.pid: %w", data, err)
	}
	if gone(pm) {
		return nil, nil // a stale file
	}
	return append([]int{pm}, Children(pm)...), nil
}

// Children returns the processes whose parent is pid.
func Children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := stat(e.Name()); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// Kill SIGKILLs s's postmaster and every process it started, as when
// its machine dies.
func (s *Server) Kill() error {
	pids, err := s.Pids()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := sigkill(pid); err != nil {
			return fmt.Errorf("pgserver: kill %s's process %d: %w", s.Name, pid, err)
		}
	}
	// The postmaster is not this process's child: poll until they are gone.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for exists(pid) && !zombie(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pgserver: %s's process %d still runs 10s after SIGKILL", s.Name, pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A killed postmaster leaves its socket and the socket's lock file, which names its pid: once
	// another process has that pid, the next server on the socket would take it for a live one.
	for _, f := range []string{".s.PGSQL.5432", ".s.PGSQL.5432.lock"} {
		if err := os.Remove(filepath.Join(s.Sock, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pgserver: %w", err)
		}
	}
	return nil
}

// stat returns the fields of /proc/pid/stat after the command's name, which may
// hold spaces and parentheses (state, ppid, ...); nil when it cannot be read.
func stat(pid string) []string {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if i := bytes.LastIndexByte(b, ')'); err == nil && i >= 0 {
		return strings.Fields(string(b[i+1:]))
	}
	return nil
}

func zombie(pid int) bool {
	f := stat(strconv.Itoa(pid))
	return len(f) == 0 || f[0] == "Z"
}

// Stop stops every server of c at once (immediate), killing those that do
// not stop. It runs even when ctx has ended.
func (c *Cluster) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	defer cancel()
	var errs []error
	for _, s := range c.servers {
		if err := s.Stop(ctx, "immediate"); err != nil {
			errs = append(errs, err, s.Kill())
		}
	}
	return errors.Join(errs...)
}

// Close stops every server of c (Stop) and deletes Root.
func (c *Cluster) Close(ctx context.Context) error {
	return errors.Join(c.Stop(ctx), os.RemoveAll(c.Root))
}

// StartOne makes and starts a single server, named "db", in c.
func (c *Cluster) StartOne(ctx context.Context) (*Server, error) {
	s, err := c.Server("db")
	if err != nil {
		return nil, err
	}
	if err := s.InitDB(ctx); err != nil {
		return nil, err
	}
	return s, s.Start(ctx)
}

// Pair is a primary and a standby streaming from it, of one Cluster.
type Pair struct {
	C                *Cluster
	Primary, Standby *Server
}

// StartPair makes and starts, in c, a primary and a standby streaming
// from it, and waits until the standby has caught up.
func (c *Cluster) StartPair(ctx context.Context) (*Pair, error) {
	p, err := c.Server("p")
	if err != nil {
		return nil, err
	}
	s, err := c.Server("s")
	if err != nil {
		return nil, err
	}
	if err := p.InitDB(ctx); err != nil {
		return nil, err
	}
	p.sync = c.Sync
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	if err := s.BaseBackup(ctx, p); err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	pair := &Pair{C: c, Primary: p, Standby: s}
	return pair, pair.WaitStreaming(ctx)
}

// DSN is a fleet's connection string for the pair's writable server.
func (p *Pair) DSN() string {
	a, b := p.Primary.Sock, p.Standby.Sock
	if a > b { // the same string whichever server is the primary
		a, b = b, a
	}
	return fmt.Sprintf("host=%s,%s dbname=postgres user=postgres sslmode=disable target_session_attrs=read-write connect_timeout=2", a, b)
}

// Exec runs statements on s, one by one, as the postgres role.
func (s *Server) Exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		return fmt.Errorf("pgserver: %s: %w", s.Name, err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgserver: %s: %s: %w", s.Name, q, err)
		}
	}
	return nil
}

// WaitStreaming waits until the standby streams from the primary and has
// replayed everything the primary had written when it was called.
func (p *Pair) WaitStreaming(ctx context.Context) error {
	return p.Primary.poll(ctx, "the standby did not catch up with the primary", "SELECT pg_current_wal_lsn()::text",
		"SELECT count(*) = 1 AND bool_and(replay_lsn >= $1::pg_lsn) FROM pg_stat_replication WHERE state = 'streaming'")
}

// poll runs q on s every 20ms until it returns true, for 30s at most; the error says what did
// not happen. first, when not empty, runs once before: its text result is q's $1.
func (s *Server) poll(ctx context.Context, what, first, q string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var args []any
	if first != "" {
		var v string
		if err := conn.QueryRow(ctx, first).Scan(&v); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		args = append(args, v)
	}
	for {
		var done bool
		err := conn.QueryRow(ctx, q, args...).Scan(&done)
		if err == nil && done {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("pgserver: %s in 30s (%w)", what, errors.Join(err, ctx.Err()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HoldBack stops the standby's WAL receiver and waits until it is gone:
// the primary's commits from then on do not reach the standby, and the
// next Failover loses them.
func (p *Pair) HoldBack(ctx context.Context) error {
	if p.C.Sync {
		return errors.New("pgserver: a synchronous standby held back would hold every commit of the primary")
	}
	if err := p.Standby.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return p.Standby.poll(ctx, "the standby's WAL receiver did not stop", "", "SELECT count(*) = 0 FROM pg_stat_wal_receiver")
}

// Failover fails over as when the primary's machine dies: it kills the
// primary, promotes the standby, then, when rebuild, makes the old
// primary's place a standby of the new one and starts it; Primary and
// Standby have swapped. killed, when not nil, is called once the old
// primary is dead, and promoted once the standby has become the primary.
func (p *Pair) Failover(ctx context.Context, rebuild bool, killed, promoted func()) error {
	if err := p.Primary.Kill(); err != nil {
		return err
	}
	if killed != nil {
		killed()
	}
	if err := p.Standby.Promote(ctx); err != nil {
		return err
	}
	if p.C.Sync {
		// The standby's command line did not set it. Until the new
		// standby streams, commits wait.
		if err := p.Standby.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"); err != nil {
			return err
		}
	}
	if promoted != nil {
		promoted()
	}
	p.Primary, p.Standby = p.Standby, p.Primary
	if !rebuild {
		return nil
	}
	if err := p.Standby.BaseBackup(ctx, p.Primary); err != nil {
		return err
	}
	if err := p.Standby.Start(ctx); err != nil {
		return err
	}
	return p.WaitStreaming(ctx)
}
