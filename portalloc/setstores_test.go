package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

func init() {
	// reserveports reserves the ports BERTH_TEST_PORTS (a comma list) on
	// 127.0.0.1 through an Allocator on the store BERTH_TEST_STORE (a
	// connection string, for host BERTH_TEST_HOST) or, without one, the
	// SQLite store in BERTH_STATE_DIR; it prints "ready" and holds them
	// until stdin closes.
	workers["reserveports"] = func(ctx context.Context) error {
		cfg := workerConfig()
		cfg.StoreDSN, cfg.Host = os.Getenv("BERTH_TEST_STORE"), os.Getenv("BERTH_TEST_HOST")
		a, err := fleet.New(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		for f := range strings.SplitSeq(os.Getenv("BERTH_TEST_PORTS"), ",") {
			p, err := strconv.ParseUint(f, 10, 16)
			if err != nil {
				return err
			}
			if _, err := a.Reserve(ctx, portalloc.Request{Addr: lo4, Label: "other"}, uint16(p)); err != nil {
				return err
			}
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	}
}

// setStore is one kind of store the set tests run against.
type setStore struct {
	// config returns an Allocator's Config on the store, with rng.
	config func(rng store.Range) portalloc.Config
	// env is what a reserveports worker needs to reach the same store.
	env []string
	// rows returns the store's rows of this host, read from the store
	// itself rather than through an Allocator.
	rows func(t *testing.T) []store.Reservation
}

// setStores are the kinds of store the set tests run against: each opens
// a fresh SQLite store, or a fresh schema of the PostgreSQL server
// BERTH_TEST_POSTGRES names (and skips the test without it).
var setStores = []struct {
	name string
	open func(t *testing.T) setStore
}{
	{"sqlite", func(t *testing.T) setStore {
		t.Helper()
		dir := t.TempDir()
		return setStore{
			config: func(rng store.Range) portalloc.Config {
				return portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Range: rng, AllowEphemeralOverlap: true}
			},
			env:  []string{"BERTH_STATE_DIR=" + dir},
			rows: func(t *testing.T) []store.Reservation { t.Helper(); return storeRows(t, dir, store.Filter{}) },
		}
	}},
	{"postgres", func(t *testing.T) setStore {
		t.Helper()
		dsn := fleetDSN(t)
		const host = "host-a"
		return setStore{
			config: func(rng store.Range) portalloc.Config {
				return portalloc.Config{StoreDSN: dsn, Host: host, Range: rng, AllowEphemeralOverlap: true}
			},
			env: []string{"BERTH_STATE_DIR=" + t.TempDir(), "BERTH_TEST_STORE=" + dsn, "BERTH_TEST_HOST=" + host},
			rows: func(t *testing.T) []store.Reservation {
				t.Helper()
				s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Host: host, SweepInterval: -1})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = s.Close() }()
				rows, err := s.List(context.Background(), store.Filter{})
				if err != nil {
					t.Fatal(err)
				}
				return rows
			},
		}
	}},
}

// ownRows returns the rows of this process whose label starts with prefix.
func ownRows(rows []store.Reservation, prefix string) []store.Reservation {
	pid := os.Getpid()
	return slices.DeleteFunc(rows, func(r store.Reservation) bool {
		return r.Owner.PID != pid || !strings.HasPrefix(r.Label, prefix)
	})
}

// holdPorts reserves ports on 127.0.0.1 in st from a worker process, which
// holds them until the test ends.
func holdPorts(tb testing.TB, st setStore, ports ...uint16) {
	tb.Helper()
	list := make([]string, len(ports))
	for i, p := range ports {
		list[i] = strconv.Itoa(int(p))
	}
	spawn(tb, "reserveports", append(slices.Clone(st.env), "BERTH_TEST_PORTS="+strings.Join(list, ","))...).ready(tb)
}

// TestSetAtomicEachStore: on the SQLite store and on PostgreSQL alike, a
// set one of whose ports cannot be had fails and leaves no row of its own
// in the store, whether another process holds a fixed port, something
// outside berth has it bound, or the range runs out after some of the
// set's ports were taken.
func TestSetAtomicEachStore(t *testing.T) {
	for _, kind := range setStores {
		t.Run(kind.name, func(t *testing.T) {
			st := kind.open(t)
			ctx := context.Background()
			dynamic := func(extra ...portset.GroupSpec) portset.SetSpec {
				return portset.SetSpec{Name: "atom", Groups: append([]portset.GroupSpec{
					{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}},
					{Name: "lb", Ports: []portset.PortSpec{{Name: "admin", Shared: true}}},
				}, extra...)}
			}
			fixed := func(port uint16) portset.GroupSpec {
				return portset.GroupSpec{Name: "db", Ports: []portset.PortSpec{{Name: "pg", Port: port}}}
			}
			for _, tc := range []struct {
				name string
				// setup makes one port of the set unobtainable and returns
				// the set and the range to allocate from.
				setup func(t *testing.T) (portset.SetSpec, store.Range)
				want  error
			}{
				{"fixed port held by another process", func(t *testing.T) (portset.SetSpec, store.Range) {
					t.Helper()
					base := freeRun(t, 5)
					holdPorts(t, st, base+4)
					return dynamic(fixed(base + 4)), store.Range{First: base, Last: base + 3}
				}, store.ErrHeld},
				{"fixed port bound outside berth", func(t *testing.T) (portset.SetSpec, store.Range) {
					t.Helper()
					base := freeRun(t, 5)
					l := mustListen(t, lo4, base+4)
					t.Cleanup(func() { _ = l.Close() })
					return dynamic(fixed(base + 4)), store.Range{First: base, Last: base + 3}
				}, store.ErrHeld},
				{"range runs out midway", func(t *testing.T) (portset.SetSpec, store.Range) {
					t.Helper()
					// 3 ports wanted of 4, 2 held elsewhere: 2 are taken,
					// and the third is not there.
					base := freeRun(t, 4)
					holdPorts(t, st, base+1, base+3)
					return dynamic(), store.Range{First: base, Last: base + 3}
				}, store.ErrExhausted},
			} {
				t.Run(tc.name, func(t *testing.T) {
					spec, rng := tc.setup(t)
					a := newAllocator(t, st.config(rng))
					before := len(st.rows(t))
					set, err := portset.Allocate(ctx, a, spec)
					if !errors.Is(err, tc.want) || set != nil {
						t.Fatalf("AllocateSet = %v, %v; want nil and an error wrapping %v", set, err, tc.want)
					}
					rows := st.rows(t)
					if left := ownRows(slices.Clone(rows), ""); len(left) != 0 {
						t.Errorf("the failed set left rows of this process in the store: %+v", left)
					}
					if len(rows) != before {
						t.Errorf("the store has %d rows after the failed set, %d before; want the same", len(rows), before)
					}
					if held := a.Held(); len(held) != 0 {
						t.Errorf("Held() after the failed set = %+v; want none", held)
					}
				})
			}
		})
	}
}

// TestConcurrentSetsEachStore: sets allocated at once from one range too
// small for all of them, on the SQLite store and on PostgreSQL alike,
// never share a port; each either gets all its ports or fails with
// ErrExhausted and leaves none, and the store holds exactly the ports of
// the sets that were made.
func TestConcurrentSetsEachStore(t *testing.T) {
	for _, kind := range setStores {
		t.Run(kind.name, func(t *testing.T) {
			st := kind.open(t)
			const sets, perSet, size = 5, 3, 12 // 15 ports wanted of 12
			ctx := context.Background()
			base := freeRun(t, size)
			rng := store.Range{First: base, Last: base + size - 1}
			type result struct {
				name string
				set  *portset.Set
				err  error
			}
			results := make([]result, sets)
			allocators := make([]*portalloc.Allocator, sets)
			for i := range allocators {
				allocators[i] = newAllocator(t, st.config(rng))
			}
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range results {
				wg.Go(func() {
					name := fmt.Sprintf("race%d", i)
					<-start
					set, err := portset.Allocate(ctx, allocators[i], portset.SetSpec{Name: name, Groups: []portset.GroupSpec{
						{Name: "svc", Members: perSet, Ports: []portset.PortSpec{{Name: "http"}}},
					}})
					results[i] = result{name, set, err}
				})
			}
			close(start)
			wg.Wait()

			owner := map[uint16]string{} // port -> the set granted it
			made := 0
			for _, r := range results {
				if r.err != nil {
					if !errors.Is(r.err, store.ErrExhausted) {
						t.Errorf("AllocateSet(%s) = %v; want success or ErrExhausted", r.name, r.err)
					}
					continue
				}
				made++
				if n := len(r.set.Members()); n != perSet {
					t.Errorf("set %s has %d members; want %d", r.name, n, perSet)
				}
				for _, m := range r.set.Members() {
					p := m.Ports["http"].Port
					if other, dup := owner[p]; dup {
						t.Errorf("port %d granted to set %s and to set %s", p, other, r.name)
					}
					if !rng.Contains(p) {
						t.Errorf("set %s got port %d; want one of %v", r.name, p, rng)
					}
					owner[p] = r.name
				}
			}
			// A set fails when its scan finds all 12 ports held, when it holds
			// at most 2 of them itself: the other 4 hold at least 10, 3 at
			// most each, so at least 2 of them are complete. And 15 ports do
			// not fit in 12.
			if made < 2 || made > size/perSet {
				t.Errorf("%d of %d sets were made; want 2 to %d", made, sets, size/perSet)
			}
			inStore := map[uint16]string{}
			for _, r := range ownRows(st.rows(t), "race") {
				name, _, _ := strings.Cut(r.Label, "/")
				if other, dup := inStore[r.Port]; dup {
					t.Errorf("the store has port %d twice, for %s and %s", r.Port, other, name)
				}
				inStore[r.Port] = name
			}
			if !maps.Equal(inStore, owner) {
				t.Errorf("the store's rows give ports to sets %v; the sets made hold %v (a failed set leaves nothing)", inStore, owner)
			}
			// And each granted port is bindable: nothing else has it.
			for p := range owner {
				if !bindable(t, store.Reservation{Key: store.Key{Protocol: store.TCP, Addr: lo4, Port: p}}) {
					t.Errorf("port %d of set %s is not bindable", p, owner[p])
				}
			}
		})
	}
}
