package portalloc_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	migfiles "github.com/berth-go/berth/internal/migrations"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func init() {
	// newbuild: a newer berth, whose store schema has one more migration
	// that older writers tolerate (statestore/testdata/nextschema). It
	// opens an Allocator on BERTH_STATE_DIR, allocates BERTH_TEST_N ports
	// of BERTH_TEST_RANGE and binds each ("port P", or "bindfail P" when
	// another process has it bound), says "ready", and at the end of
	// stdin closes the Allocator.
	workers["newbuild"] = func(ctx context.Context) error {
		migfiles.SetOverlay("statestore", os.DirFS(filepath.Join("..", "statestore", "testdata", "nextschema")))
		r, err := store.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
		if err != nil {
			return err
		}
		cfg := workerConfig()
		cfg.Range, cfg.AllowEphemeralOverlap = r, true
		a, err := portalloc.New(ctx, cfg)
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(os.Getenv("BERTH_TEST_N"))
		var bound []net.Listener
		for range n {
			res, err := a.Allocate(ctx, portalloc.Request{Label: "newbuild"})
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", res.AddrPort().String())
			if err != nil {
				fmt.Println("bindfail", res.Port)
				continue
			}
			bound = append(bound, l)
			fmt.Println("port", res.Port)
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		for _, l := range bound {
			_ = l.Close()
		}
		return a.Close()
	}
}

// newBuildPorts reads a newbuild worker's ports up to "ready"; a port the
// kernel says another process has bound fails the test.
func newBuildPorts(tb testing.TB, p *proc) []uint16 {
	tb.Helper()
	var ports []uint16
	for {
		line := readLine(tb, p)
		if line == "ready" {
			return ports
		}
		what, num, _ := strings.Cut(line, " ")
		port, _ := strconv.Atoi(num)
		switch what {
		case "port":
			ports = append(ports, uint16(port))
		case "bindfail":
			tb.Errorf("the newer build was granted port %d, which another process has bound", port)
		default:
			tb.Fatalf("newbuild worker said %q", line)
		}
	}
}

// allocateBound allocates n ports with a and binds each, until the test
// ends; a port the kernel says another process has bound fails the test.
func allocateBound(tb testing.TB, a *portalloc.Allocator, n int) []store.Reservation {
	tb.Helper()
	var rs []store.Reservation
	for range n {
		r, err := a.Allocate(context.Background(), portalloc.Request{Label: "old"})
		if err != nil {
			tb.Fatalf("Allocate: %v", err)
		}
		l, err := net.Listen("tcp", r.AddrPort().String())
		if err != nil {
			tb.Errorf("this build was granted port %d, which another process has bound: %v", r.Port, err)
			continue
		}
		tb.Cleanup(func() { _ = l.Close() })
		rs = append(rs, r)
	}
	return rs
}

// schemaVersion reads the schema version of the store in dir.
func schemaVersion(tb testing.TB, dir string) uint {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "berth.db")+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var v uint
	if err := db.QueryRow("SELECT version FROM schema_migrations").Scan(&v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// TestAllocatorSharesStoreWithNewerBuild: an Allocator of this berth and
// one of a newer berth, whose schema change older writers tolerate, share
// a store in either order: when the newer one migrates the store under the
// running older Allocator, and when the older one opens a store the newer
// one has migrated. The older Allocator never falls back, every port
// granted is bound by its holder alone (the kernel referees), no row is
// lost, and Close releases exactly the older Allocator's rows.
func TestAllocatorSharesStoreWithNewerBuild(t *testing.T) {
	rng := store.Range{First: allocRange.First, Last: allocRange.First + 99}
	for _, newFirst := range []bool{false, true} {
		name := "migrated-under-running-allocator"
		if newFirst {
			name = "opens-migrated-store"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			spawnNew := func() (*proc, []uint16) {
				p := spawn(t, "newbuild", "BERTH_STATE_DIR="+dir, "BERTH_TEST_RANGE="+rng.String(), "BERTH_TEST_N=5")
				return p, newBuildPorts(t, p)
			}
			var (
				newer    *proc
				newPorts []uint16
				oldRes   []store.Reservation
			)
			if newFirst {
				newer, newPorts = spawnNew()
			}
			a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: rng, AllowEphemeralOverlap: true, IgnoreEnv: true})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			oldRes = append(oldRes, allocateBound(t, a, 5)...)
			if !newFirst {
				newer, newPorts = spawnNew()
			}
			if v := schemaVersion(t, dir); v != statestore.SchemaVersion+1 {
				t.Errorf("schema version with both running = %d; want %d, the newer build's", v, statestore.SchemaVersion+1)
			}
			oldRes = append(oldRes, allocateBound(t, a, 5)...)
			if st := a.Stats(); st.Fallback != "" || st.Fallbacks != 0 {
				t.Errorf("older Allocator: Stats() = %+v; want no fallback", st)
			}
			mine := map[uint16]bool{}
			for _, r := range oldRes {
				mine[r.Port] = true
			}
			for _, p := range newPorts {
				if mine[p] {
					t.Errorf("port %d granted to both builds", p)
				}
			}
			if rows := storeRows(t, dir, store.Filter{}); len(rows) != len(oldRes)+len(newPorts) {
				t.Errorf("rows in the store = %d; want %d", len(rows), len(oldRes)+len(newPorts))
			}
			if err := a.Close(); err != nil {
				t.Errorf("Close of the older Allocator: %v", err)
			}
			if rows := storeRows(t, dir, store.Filter{}); len(rows) != len(newPorts) {
				t.Errorf("rows after the older Allocator closed = %d; want the newer build's %d", len(rows), len(newPorts))
			}
			_ = newer.stdin.Close()
			if err := newer.cmd.Wait(); err != nil {
				t.Errorf("newbuild worker: %v", err)
			}
			if rows := storeRows(t, dir, store.Filter{}); len(rows) != 0 {
				t.Errorf("rows after both closed = %d; want 0", len(rows))
			}
		})
	}
}
