package portalloc_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// What the tests of this package share besides main_test.go's processes:
// sockets, logs, a look at the store's rows, and the faults done to it.

func init() {
	// sqlitelock holds a write transaction on the store of
	// BERTH_STATE_DIR the way a program outside berth would (BEGIN
	// IMMEDIATE), until stdin closes.
	workers["sqlitelock"] = func(ctx context.Context) error {
		return holdWriteTx(ctx, filepath.Join(os.Getenv("BERTH_STATE_DIR"), "berth.db"))
	}
	// flocker holds the store's write lock, <db>.lock, as a berth process
	// stuck in a transaction would, until stdin closes.
	workers["flocker"] = func(context.Context) error {
		l, err := filelock.Open(filepath.Join(os.Getenv("BERTH_STATE_DIR"), "berth.db") + ".lock")
		if err != nil {
			return err
		}
		defer func() { _ = l.Close() }()
		if err := l.Lock(); err != nil {
			return err
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	}
}

// mustListen binds addr:port for TCP, failing tb when it cannot.
func mustListen(tb testing.TB, addr netip.Addr, port uint16) net.Listener {
	tb.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		tb.Fatalf("port %d is not bindable: %v", port, err)
	}
	return l
}

// bindable reports whether r's port can be bound on its address now: no
// other process has it bound.
func bindable(tb testing.TB, r store.Reservation) bool {
	tb.Helper()
	network := "tcp"
	if r.Protocol == store.UDP {
		c, err := net.ListenPacket("udp", r.AddrPort().String())
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}
	l, err := net.Listen(network, r.AddrPort().String())
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// logCounter records what an Allocator logs, one line a message.
type logCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *logCounter) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		c.mu.Lock()
		c.lines = append(c.lines, args)
		c.mu.Unlock()
	}, funcr.Options{Verbosity: 1})
}

// count returns how many lines contain phrase.
func (c *logCounter) count(phrase string) int { return len(c.find(phrase)) }

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

// dump returns every line logged.
func (c *logCounter) dump() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// storeRows returns the rows of the SQLite store of dir that f selects.
func storeRows(tb testing.TB, dir string, f store.Filter) []store.Reservation {
	tb.Helper()
	s, err := statestore.Open(context.Background(), filepath.Join(dir, "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		tb.Fatalf("open the store of %s: %v", dir, err)
	}
	defer func() { _ = s.Close() }()
	rows, err := s.List(context.Background(), f)
	if err != nil {
		tb.Fatalf("List: %v", err)
	}
	return rows
}

// rowsLabelled returns the rows of the SQLite store of dir whose label
// starts with prefix.
func rowsLabelled(tb testing.TB, dir, prefix string) []store.Reservation {
	tb.Helper()
	var out []store.Reservation
	for _, r := range storeRows(tb, dir, store.Filter{}) {
		if strings.HasPrefix(r.Label, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// setSchemaVersion sets the schema version recorded in dir's store, as a
// newer (or, to undo it, this) berth would have written it. A newer one
// comes with a newer write version: a change this berth must not write to.
func setSchemaVersion(tb testing.TB, dir string, v uint) {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "berth.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	w := statestore.WriteVersion
	if v > statestore.SchemaVersion {
		w++
	}
	if _, err := db.Exec(fmt.Sprintf("UPDATE schema_migrations SET version = %d; PRAGMA user_version = %d", v, w)); err != nil {
		tb.Fatal(err)
	}
}

// newerStore makes dir's store one a newer berth wrote: this berth can
// read it but not write to it.
func newerStore(tb testing.TB, dir string) {
	tb.Helper()
	s, err := statestore.Open(context.Background(), filepath.Join(dir, "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Close(); err != nil {
		tb.Fatal(err)
	}
	setSchemaVersion(tb, dir, statestore.SchemaVersion+1)
}

// holdWriteTx holds a write transaction on db the way a program outside
// berth would, says "ready", and holds it until stdin closes.
func holdWriteTx(ctx context.Context, db string) error {
	conn, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	c, err := conn.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_, err = c.ExecContext(ctx, "ROLLBACK")
	return err
}

// holdSQLiteWriteLock starts a process outside berth's locking that holds
// a write transaction on dir's store; closing what it returns ends it.
func holdSQLiteWriteLock(tb testing.TB, dir string) io.Closer {
	tb.Helper()
	return spawn(tb, "sqlitelock", "BERTH_STATE_DIR="+dir).ready(tb).stdin
}

// needRoot skips tb unless it runs as root.
func needRoot(tb testing.TB, what string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skipf("skipping: %s needs root", what)
	}
}

// runCmd runs a command, returning its output with the error.
func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// newOn returns an Allocator of cfg (allocRange unless it names a range,
// no BERTH_* variable), closed with tb without checking Close's error:
// after a fault the store may not let it release, which is for logging.
func newOn(tb testing.TB, cfg portalloc.Config) *portalloc.Allocator {
	tb.Helper()
	if cfg.Range == (store.Range{}) {
		cfg.Range = allocRange
	}
	cfg.IgnoreEnv = true
	a, err := portalloc.New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { _ = a.Close() })
	return a
}

// holdsPort reports whether a holds a reservation of port.
func holdsPort(a *portalloc.Allocator, port uint16) bool {
	for _, r := range a.Held() {
		if r.Port == port {
			return true
		}
	}
	return false
}

// ephemeralRange is the OS ephemeral range as New reads it.
func ephemeralRange(tb testing.TB) store.Range {
	tb.Helper()
	r, err := portrange.Ephemeral()
	if err != nil {
		tb.Logf("the OS ephemeral range: %v; taking %v", err, r)
	}
	return store.Range(r)
}

// testHolder returns a holder name of the test's own, which no run of the
// test used before (a holder's keeper outlives the test that made it, for
// the lease). With a, the holder's reservations are released, and its
// keeper lets go of their locks, when tb ends.
func testHolder(tb testing.TB, a ...*portalloc.Allocator) string {
	tb.Helper()
	name := "test/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, x := range a {
		tb.Cleanup(func() { _, _ = x.ReleaseHolder(context.Background(), name, store.Filter{}) })
	}
	return name
}
