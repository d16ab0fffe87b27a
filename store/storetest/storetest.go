// Package storetest checks that an implementation of store.Store keeps the
// promises every berth store makes, in the manner of testing/fstest: a
// store's own tests call Run with a Config that says how to open a fresh,
// empty store and how to reach the same database again, and Run checks
// against it the conflict rule, owners, reaping, scans, blocks, sticky
// ports, concurrency within one process and across processes, and the
// refusal of a schema newer than the store knows.
//
// The owners Run uses are real processes: this test process, and child
// processes it starts (sleep) and, for dead owners, kills. Run skips the
// cases that need them where the system has no sleep command. Most cases
// bind no port (their probes are functions of their own) and use port
// numbers from 40000 up as rows only.
//
// Two cases need more from the store than a fresh instance:
//
//   - ProcessesRace re-runs the test binary as several worker processes
//     that Reopen the same database and Scan the same few ports of
//     Config.Ports at the same moment. Each worker listens on loopback on
//     every port it is granted and holds it until the case ends: the kernel
//     refuses a port granted twice, and the case checks that no port went
//     to two processes, that the grants and the store's rows agree, and
//     that the ports ran out exactly when every one was taken. The test
//     binary must call MaybeRunWorker before its tests run.
//   - SchemaTooNew records, through Config.SetSchemaVersion, a schema
//     version one above the one the store wrote (one the store must not
//     write to: where the store keeps a write version, the hook raises it
//     too), and checks that Reopen refuses the database with an error
//     wrapping store.ErrSchemaTooNew, leaves the recorded version as it
//     was, and, the version put back, finds the reservation made before.
//
// Leases checks a store that keeps reservations of named holders of one
// host (an Owner with Holder set): it is skipped for one that refuses them
// (pgstore, whose named holders are fleet-wide).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-go/berth/store"
)

// Config tells Run how to reach the store under test. Every field is
// required: Run fails at once when one is missing, so that no promise goes
// unchecked because a hook was forgotten. Run does not modify it.
type Config struct {
	// Open returns a new, empty store for one subtest, and the locator of
	// its database: what Reopen takes to open the same database again (a
	// file's path, a connection string). Run closes the store.
	Open func(t *testing.T) (s store.Store, locator string)
	// Reopen opens another store on the database locator names, as a
	// second program would. It runs in the test process and in the worker
	// processes of ProcessesRace, where there is no *testing.T, so it
	// must not need one; the caller closes what it returns.
	Reopen func(ctx context.Context, locator string) (store.Store, error)
	// SchemaVersion returns the schema version recorded in the database
	// locator names, read the store's own way (a store.Store refuses to
	// open a version it does not know, so it cannot be asked).
	SchemaVersion func(tb testing.TB, locator string) uint
	// SetSchemaVersion records v as the schema version of the database
	// locator names, as a newer release of the store would have, and
	// nothing else; for a store that keeps a write version apart (see
	// statestore), a v above the store's own comes with a write version
	// above its own too, so that the store must refuse it.
	SetSchemaVersion func(tb testing.TB, locator string, v uint)
	// Ports is where ProcessesRace binds: at least its first 8 ports, on
	// 127.0.0.1, TCP. The test binaries of go test ./... run in parallel
	// on one host, so the range must be private to the calling package's
	// tests while they run (berth's own take theirs from
	// internal/testports, and hold its lock).
	Ports store.Range
}

// racePorts is how many ports of Config.Ports ProcessesRace binds.
const racePorts = 8

// check reports the first thing missing from c.
func (c Config) check() error {
	var missing []string
	for name, unset := range map[string]bool{"Open": c.Open == nil, "Reopen": c.Reopen == nil,
		"SchemaVersion": c.SchemaVersion == nil, "SetSchemaVersion": c.SetSchemaVersion == nil} {
		if unset {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("storetest: Config.%s not set: every field is required", strings.Join(missing, ", Config."))
	}
	if c.Ports.First == 0 || int(c.Ports.Last)-int(c.Ports.First)+1 < racePorts {
		return fmt.Errorf("storetest: Config.Ports %d-%d: want a range of at least %d ports from 1 up, private to this package's tests", c.Ports.First, c.Ports.Last, racePorts)
	}
	return nil
}

// fixture is what a case gets: the store Open returned for it, the locator
// of that store's database, and the Config to reach it again.
type fixture struct {
	c       Config
	s       store.Store
	locator string
}

// plain adapts a case that needs only the store.
func plain(fn func(t *testing.T, s store.Store)) func(t *testing.T, f fixture) {
	return func(t *testing.T, f fixture) { fn(t, f.s) }
}

// Run runs the conformance suite against the stores c opens, one subtest
// per case, each on a fresh store. It binds ports only in c.Ports, and
// needs MaybeRunWorker to have been called with c.
func Run(t *testing.T, c Config) {
	t.Helper()
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	if !registered.Load() {
		t.Fatal("storetest: MaybeRunWorker was not called: call storetest.MaybeRunWorker(cfg) from TestMain, before the tests run, with the Config given to Run")
	}
	cases := []struct {
		name string
		fn   func(t *testing.T, f fixture)
	}{
		{"ConflictMatrix", plain(testConflictMatrix)},
		{"SameOwnerReReserve", plain(testSameOwner)},
		{"DeadOwnerReaped", plain(testDeadOwner)},
		{"OwnerCheckedRelease", plain(testRelease)},
		{"OwnerCheckedTransfer", plain(testTransfer)},
		{"ScanFillAndExhaustion", plain(testScanFill)},
		{"ScanProbe", plain(testScanProbe)},
		{"BlockAllOrNone", plain(testBlock)},
		{"Sticky", plain(testSticky)},
		{"List", plain(testList)},
		{"InvalidKeys", plain(testInvalid)},
		{"ConcurrentScans", plain(testConcurrentScans)},
		{"ProcessesRace", testProcessesRace},
		{"SchemaTooNew", testSchemaTooNew},
		{"Leases", plain(testLeases)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, locator := c.Open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close() = %v", err)
				}
			})
			tc.fn(t, fixture{c: c, s: s, locator: locator})
		})
	}
}

// addrs are the addresses of the conflict matrix: two of one IPv4 host,
// another IPv4 address, the two wildcards, IPv6 loopback and link-local,
// and an IPv4-mapped IPv6 address, which must be stored as its IPv4 form
// and so conflict with it.
var addrs = []string{"127.0.0.1", "127.0.0.2", "10.1.2.3", "0.0.0.0", "::1", "::", "fe80::1", "::ffff:127.0.0.1"}

func key(p store.Protocol, addr string, port uint16) store.Key {
	return store.Key{Protocol: p, Addr: netip.MustParseAddr(addr), Port: port}
}

func self(tb testing.TB) store.Owner {
	tb.Helper()
	o, err := store.Self()
	if err != nil {
		tb.Fatal(err)
	}
	return o
}

// mustReserve reserves req in s, failing tb if it cannot.
func mustReserve(ctx context.Context, tb testing.TB, s store.Store, req store.Request) {
	tb.Helper()
	if _, err := s.Reserve(ctx, req); err != nil {
		tb.Fatalf("Reserve(%v) for %v = %v", req.Key, req.Owner, err)
	}
}

// child starts a process that sleeps until the test ends and returns its
// identity and a function that kills it and waits for it to be gone.
func child(tb testing.TB) (store.Owner, func()) {
	tb.Helper()
	path, err := exec.LookPath("sleep")
	if err != nil {
		tb.Skipf("no sleep command to start owner processes with: %v", err)
	}
	cmd := exec.Command(path, "300")
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start an owner process: %v", err)
	}
	var once sync.Once
	kill := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	tb.Cleanup(kill)
	o, err := store.LookupOwner(context.Background(), cmd.Process.Pid)
	if err != nil {
		tb.Fatalf("identify owner process %d: %v", cmd.Process.Pid, err)
	}
	return o, kill
}

// testConflictMatrix: for every protocol and pair of addresses, a second
// owner is refused exactly when the keys conflict, with a *ConflictError
// naming the holder; otherwise both hold their keys at once.
func testConflictMatrix(t *testing.T, s store.Store) {
	ctx := context.Background()
	other, _ := child(t)
	port := uint16(40000)
	protos := []store.Protocol{store.TCP, store.UDP}
	for i, p := range protos {
		for _, a := range addrs {
			for _, b := range addrs {
				port++
				held := key(p, a, port)
				mustReserve(ctx, t, s, store.Request{Key: held, Owner: other, Label: "holder"})
				want := key(p, b, port)
				_, err := s.Reserve(ctx, store.Request{Key: want})
				var ce *store.ConflictError
				normal, _ := want.Normalize()
				heldNormal, _ := held.Normalize()
				switch {
				case heldNormal.Conflicts(normal):
					if !errors.As(err, &ce) || !errors.Is(err, store.ErrHeld) || ce.Holder.Owner.PID != other.PID || !ce.Holder.Conflicts(normal) || ce.Holder.Label != "holder" || ce.Self {
						t.Errorf("Reserve(%v) with %v held by pid %d = %v; want a *ConflictError naming that holder", want, held, other.PID, err)
					}
				case err != nil:
					t.Errorf("Reserve(%v) with %v held = %v; want it granted (no conflict)", want, held, err)
				}
				// The other protocol never conflicts.
				otherProto := protos[1-i]
				if _, err := s.Reserve(ctx, store.Request{Key: key(otherProto, a, port)}); err != nil {
					t.Errorf("Reserve(%v) with %v held = %v; want it granted (other protocol)", key(otherProto, a, port), held, err)
				}
			}
		}
	}
}

// testSameOwner: an owner that reserves exactly what it holds gets its row
// back, without a probe; its own wildcard in the way of a specific address
// is a conflict that says Self.
func testSameOwner(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := key(store.TCP, "127.0.0.1", 41000)
	first, err := s.Reserve(ctx, store.Request{Key: k, Label: "api"})
	if err != nil {
		t.Fatalf("Reserve(%v) = %v", k, err)
	}
	probed := false
	again, err := s.Reserve(ctx, store.Request{Key: k, Label: "api", Probe: func(k store.Key) error { probed = true; return &store.ConflictError{Key: k, Bound: true} }})
	if err != nil || again.Key != first.Key || again.Owner.PID != first.Owner.PID || probed {
		t.Errorf("second Reserve(%v) by its owner = %+v, %v (probed %v); want the same row, no probe", k, again, err, probed)
	}
	wild := key(store.TCP, "0.0.0.0", 41001)
	mustReserve(ctx, t, s, store.Request{Key: wild})
	_, err = s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 41001)})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Self {
		t.Errorf("Reserve under this process's own wildcard = %v; want a *ConflictError with Self", err)
	}
}

// testDeadOwner: a row whose owner has exited stands in nobody's way: a
// Reserve of a conflicting key deletes it, and Reap deletes the others.
func testDeadOwner(t *testing.T, s store.Store) {
	ctx := context.Background()
	gone, kill := child(t)
	mustReserve(ctx, t, s, store.Request{Key: key(store.TCP, "127.0.0.1", 42000), Owner: gone})
	mustReserve(ctx, t, s, store.Request{Key: key(store.UDP, "0.0.0.0", 42001), Owner: gone})
	kill()
	if gone.Alive(ctx) {
		t.Fatalf("pid %d is still alive after it was killed", gone.PID)
	}
	r, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "0.0.0.0", 42000)})
	if err != nil || r.Owner.PID == gone.PID {
		t.Errorf("Reserve over a dead owner's row = %+v, %v; want it granted to this process", r, err)
	}
	// The row left of the dead owner goes now, unless a background sweep
	// of the store took it first.
	n, err := s.Reap(ctx)
	if err != nil || n > 1 {
		t.Errorf("Reap() = %d, %v; want at most the one row left of the dead owner", n, err)
	}
	rows, err := s.List(ctx, store.Filter{OwnerPID: gone.PID})
	if err != nil || len(rows) != 0 {
		t.Errorf("List of the dead owner's rows = %v, %v; want none", rows, err)
	}
}

// testRelease: Release deletes only the named owner's row.
func testRelease(t *testing.T, s store.Store) {
	ctx := context.Background()
	other, _ := child(t)
	k := key(store.TCP, "127.0.0.1", 43000)
	mustReserve(ctx, t, s, store.Request{Key: k, Owner: other})
	if err := s.Release(ctx, k, store.Owner{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release(%v) by a process that does not hold it = %v; want ErrNotFound", k, err)
	}
	if rows, _ := s.List(ctx, store.Filter{Port: k.Port}); len(rows) != 1 {
		t.Fatalf("after a refused Release, List = %v; want the row still there", rows)
	}
	if err := s.Release(ctx, k, other); err != nil {
		t.Errorf("Release(%v) by its owner = %v", k, err)
	}
	if err := s.Release(ctx, k, other); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second Release(%v) = %v; want ErrNotFound", k, err)
	}
	if rows, _ := s.List(ctx, store.Filter{Port: k.Port}); len(rows) != 0 {
		t.Errorf("after Release, List = %v; want nothing", rows)
	}
}

// testTransfer: Transfer moves only the named owner's row, to a live
// owner, who can then release it.
func testTransfer(t *testing.T, s store.Store) {
	ctx := context.Background()
	to, _ := child(t)
	k := key(store.UDP, "::1", 44000)
	if err := s.Transfer(ctx, k, store.Owner{}, to); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Transfer of a row nobody holds = %v; want ErrNotFound", err)
	}
	mustReserve(ctx, t, s, store.Request{Key: k, Label: "handed"})
	if err := s.Transfer(ctx, k, to, self(t)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Transfer from an owner that does not hold the row = %v; want ErrNotFound", err)
	}
	if err := s.Transfer(ctx, k, store.Owner{}, to); err != nil {
		t.Fatalf("Transfer(%v) to pid %d = %v", k, to.PID, err)
	}
	rows, err := s.List(ctx, store.Filter{Port: k.Port})
	if err != nil || len(rows) != 1 || !rows[0].Owner.Same(to) || rows[0].Label != "handed" {
		t.Errorf("after Transfer, List = %+v, %v; want the row owned by pid %d with its label", rows, err, to.PID)
	}
	if err := s.Release(ctx, k, store.Owner{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Release by the old owner after Transfer = %v; want ErrNotFound", err)
	}
	if err := s.Release(ctx, k, to); err != nil {
		t.Errorf("Release by the new owner = %v", err)
	}
}

// Candidates returns a ScanRequest.Next that yields ports in order, then
// reports there are no more.
func Candidates(ports ...uint16) func() (uint16, bool) {
	return func() (uint16, bool) {
		if len(ports) == 0 {
			return 0, false
		}
		p := ports[0]
		ports = ports[1:]
		return p, true
	}
}

// testScanFill: repeated scans over the same candidates hand out each
// free one once, pass over one a live owner holds, then run out with
// ErrExhausted and leave no row behind.
func testScanFill(t *testing.T, s store.Store) {
	ctx := context.Background()
	other, _ := child(t)
	ports := []uint16{45000, 45001, 45002, 45003, 45004}
	mustReserve(ctx, t, s, store.Request{Key: key(store.TCP, "0.0.0.0", 45002), Owner: other})
	var got []uint16
	for range len(ports) - 1 {
		r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Label: "fill", Next: Candidates(ports...)})
		if err != nil {
			t.Fatalf("Scan %d = %v; want a port", len(got), err)
		}
		if r.Kind != store.Dynamic || r.Label != "fill" {
			t.Errorf("Scan row = %+v; want kind dynamic, label fill", r)
		}
		got = append(got, r.Port)
	}
	slices.Sort(got)
	if want := []uint16{45000, 45001, 45003, 45004}; !slices.Equal(got, want) {
		t.Errorf("scans gave %v; want %v (45002 is held by another owner)", got, want)
	}
	_, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Next: Candidates(ports...)})
	if !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Scan with every candidate held = %v; want ErrExhausted", err)
	}
	if rows, _ := s.List(ctx, store.Filter{}); len(rows) != len(ports) {
		t.Errorf("List after the scans = %d rows; want %d", len(rows), len(ports))
	}
}

// testScanProbe: a candidate the probe refuses is passed over; a probe
// error ends the scan with that error and no row.
func testScanProbe(t *testing.T, s store.Store) {
	ctx := context.Background()
	var probed []uint16
	r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.UDP, Addr: netip.MustParseAddr("127.0.0.1"), Next: Candidates(46000, 46001),
		Probe: func(k store.Key) error {
			probed = append(probed, k.Port)
			if k.Port == 46000 {
				return &store.ConflictError{Key: k, Bound: true}
			}
			return nil
		}})
	if err != nil || r.Port != 46001 || !slices.Equal(probed, []uint16{46000, 46001}) {
		t.Errorf("Scan with 46000 unbindable = %+v, %v, probed %v; want 46001 after probing both", r, err, probed)
	}
	boom := errors.New("probe failed")
	_, err = s.Scan(ctx, store.ScanRequest{Protocol: store.UDP, Addr: netip.MustParseAddr("127.0.0.1"), Next: Candidates(46002),
		Probe: func(store.Key) error { return boom }})
	if !errors.Is(err, boom) {
		t.Errorf("Scan with a failing probe = %v; want the probe's error", err)
	}
	if rows, _ := s.List(ctx, store.Filter{Port: 46002}); len(rows) != 0 {
		t.Errorf("a failed probe left %v; want no row", rows)
	}
	_, err = s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 46003), Probe: func(k store.Key) error { return &store.ConflictError{Key: k, Bound: true} }})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.PID != 0 {
		t.Errorf("Reserve of a port the probe finds bound = %v; want a *ConflictError with no berth holder", err)
	}
}

// testBlock: a block is n consecutive free ports, all reserved or none; a
// held port inside a candidate block moves the block past it.
func testBlock(t *testing.T, s store.Store) {
	ctx := context.Background()
	other, _ := child(t)
	mustReserve(ctx, t, s, store.Request{Key: key(store.TCP, "127.0.0.1", 47002), Owner: other})
	req := func(bases ...uint16) store.ScanRequest {
		return store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Label: "block", Next: Candidates(bases...)}
	}
	rows, err := s.ScanBlock(ctx, req(47000, 47003), 3)
	if err != nil || len(rows) != 3 || rows[0].Port != 47003 || rows[2].Port != 47005 {
		t.Errorf("ScanBlock(3) with 47002 held = %+v, %v; want 47003-47005", rows, err)
	}
	_, err = s.ScanBlock(ctx, req(47000, 47001), 3)
	if !errors.Is(err, store.ErrExhausted) {
		t.Errorf("ScanBlock with no free block = %v; want ErrExhausted", err)
	}
	if got, _ := s.List(ctx, store.Filter{Label: "block"}); len(got) != 3 {
		t.Errorf("after a failed ScanBlock, %d block rows; want the 3 of the first block only", len(got))
	}
}

// testSticky: Remember and Recall keep the last port per label and
// protocol.
func testSticky(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, ok, err := s.Recall(ctx, "db", store.TCP); ok || err != nil {
		t.Errorf("Recall of a label never remembered = %v, %v; want false, nil", ok, err)
	}
	for _, p := range []uint16{48000, 48001} {
		if err := s.Remember(ctx, "db", store.TCP, p); err != nil {
			t.Fatalf("Remember(db, %d) = %v", p, err)
		}
	}
	if p, ok, err := s.Recall(ctx, "db", store.TCP); p != 48001 || !ok || err != nil {
		t.Errorf("Recall(db, tcp) = %d, %v, %v; want the last, 48001", p, ok, err)
	}
	if _, ok, _ := s.Recall(ctx, "db", store.UDP); ok {
		t.Error("Recall(db, udp) found tcp's port; want protocols apart")
	}
}

// testList: List filters by protocol, port, label and owner.
func testList(t *testing.T, s store.Store) {
	ctx := context.Background()
	other, _ := child(t)
	for _, r := range []store.Request{
		{Key: key(store.TCP, "127.0.0.1", 49000), Label: "a"},
		{Key: key(store.UDP, "127.0.0.1", 49000), Label: "b"},
		{Key: key(store.TCP, "::1", 49002), Label: "a", Owner: other},
	} {
		mustReserve(ctx, t, s, r)
	}
	for _, tc := range []struct {
		f    store.Filter
		want int
	}{
		{store.Filter{}, 3},
		{store.Filter{Protocol: store.TCP}, 2},
		{store.Filter{Port: 49000}, 2},
		{store.Filter{Label: "a"}, 2},
		{store.Filter{OwnerPID: other.PID}, 1},
	} {
		if rows, err := s.List(ctx, tc.f); err != nil || len(rows) != tc.want {
			t.Errorf("List(%+v) = %d rows, %v; want %d", tc.f, len(rows), err, tc.want)
		}
	}
}

// testInvalid: keys out of their accepted values are refused with a
// *FieldError, and nothing is stored.
func testInvalid(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, k := range []store.Key{
		{Protocol: "sctp", Addr: netip.MustParseAddr("127.0.0.1"), Port: 1},
		{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 0},
		{Protocol: store.TCP, Port: 1},
		{Protocol: store.TCP, Addr: netip.MustParseAddr("fe80::1%eth0"), Port: 1},
	} {
		_, err := s.Reserve(ctx, store.Request{Key: k})
		var fe *store.FieldError
		if !errors.As(err, &fe) || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Reserve(%v) = %v; want a *FieldError", k, err)
		}
	}
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 1), Label: "x\x1b]0;t\a"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Reserve with a label holding escapes = %v; want ErrInvalid", err)
	}
	// Owners, kinds and blocks out of their accepted values are refused
	// alike by every store: the validation is package store's.
	me := self(t)
	k := key(store.TCP, "127.0.0.1", 1)
	next := func() (uint16, bool) { return 0, false }
	reserve := func(req store.Request) func() error {
		return func() error {
			_, err := s.Reserve(ctx, req)
			return err
		}
	}
	// scan calls Scan for n == 1, else ScanBlock.
	scan := func(req store.ScanRequest, n int) func() error {
		req.Protocol, req.Addr = store.TCP, k.Addr
		return func() error {
			if n == 1 {
				_, err := s.Scan(ctx, req)
				return err
			}
			_, err := s.ScanBlock(ctx, req, n)
			return err
		}
	}
	for _, tc := range []struct {
		name  string
		field string
		call  func() error
	}{
		{"Reserve for pid 2^31", "owner", reserve(store.Request{Key: k, Owner: store.Owner{PID: 1 << 31, Start: me.Start, Namespace: me.Namespace}})},
		{"Reserve for pid -1", "owner", reserve(store.Request{Key: k, Owner: store.Owner{PID: -1, Start: 1}})},
		{"Reserve for a pid with no start or scope", "owner", reserve(store.Request{Key: k, Owner: store.Owner{PID: me.PID}})},
		{"Reserve for a holder without a lease", "ttl", reserve(store.Request{Key: k, Owner: store.Owner{Holder: "ci/job"}})},
		{"Reserve for a process with a lease", "ttl", reserve(store.Request{Key: k, TTL: time.Hour})},
		{"Reserve of kind sticky", "kind", reserve(store.Request{Key: k, Kind: "sticky"})},
		{"Scan with no candidates iterator", "next", scan(store.ScanRequest{}, 1)},
		{"Scan for pid 2^31", "owner", scan(store.ScanRequest{Next: next, Owner: store.Owner{PID: 1 << 31, Start: 1}}, 1)},
		{"ScanBlock of MaxBlock+1", "n", scan(store.ScanRequest{Next: next}, store.MaxBlock+1)},
		{"ScanBlock of 0", "n", scan(store.ScanRequest{Next: next}, 0)},
		{"Transfer to pid 2^31", "owner", func() error {
			return s.Transfer(ctx, k, store.Owner{}, store.Owner{PID: 1 << 31, Start: 1})
		}},
	} {
		var fe *store.FieldError
		if err := tc.call(); !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s = %v; want a *FieldError for %q", tc.name, err, tc.field)
		}
	}
	if rows, _ := s.List(ctx, store.Filter{}); len(rows) != 0 {
		t.Errorf("refused requests stored %v", rows)
	}
}

// testConcurrentScans: goroutines scanning the same candidates at once
// never get the same port, and together get every free one.
func testConcurrentScans(t *testing.T, s store.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 16
	ports := make([]uint16, n)
	for i := range ports {
		ports[i] = 50000 + uint16(i)
	}
	var wg sync.WaitGroup
	got, errs := make([]uint16, n), make([]error, n)
	for i := range n {
		wg.Go(func() {
			r, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: netip.MustParseAddr("0.0.0.0"), Next: Candidates(ports...)})
			got[i], errs[i] = r.Port, err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("concurrent Scan = %v", err)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, ports) {
		t.Errorf("%d concurrent scans got %v; want each of %v once", n, got, ports)
	}
}

// testSchemaTooNew: see SchemaTooNew in the package doc.
func testSchemaTooNew(t *testing.T, f fixture) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := key(store.TCP, "127.0.0.1", 51000)
	if _, err := f.s.Reserve(ctx, store.Request{Key: k, Label: "before"}); err != nil {
		t.Fatalf("Reserve(%v) = %v", k, err)
	}
	v := f.c.SchemaVersion(t, f.locator)
	if v == 0 {
		t.Fatalf("SchemaVersion of an opened store = 0; want the version the store wrote")
	}
	newer := v + 1
	f.c.SetSchemaVersion(t, f.locator, newer)
	if got := f.c.SchemaVersion(t, f.locator); got != newer {
		t.Fatalf("SchemaVersion after SetSchemaVersion(%d) = %d; the hooks disagree", newer, got)
	}
	if s, err := f.c.Reopen(ctx, f.locator); err == nil {
		_ = s.Close()
		t.Errorf("Reopen of a database of schema version %d (this store wrote %d) = nil error; want one wrapping ErrSchemaTooNew", newer, v)
	} else if !errors.Is(err, store.ErrSchemaTooNew) {
		t.Errorf("Reopen of a database of schema version %d (this store wrote %d) = %v; want an error wrapping ErrSchemaTooNew", newer, v, err)
	}
	if got := f.c.SchemaVersion(t, f.locator); got != newer {
		t.Errorf("after a refused Reopen, SchemaVersion = %d; want %d left as it was", got, newer)
	}

	// Back to the version the store knows: nothing else was touched.
	f.c.SetSchemaVersion(t, f.locator, v)
	s, err := f.c.Reopen(ctx, f.locator)
	if err != nil {
		t.Fatalf("Reopen with schema version %d put back = %v", v, err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	}()
	rows, err := s.List(ctx, store.Filter{Port: k.Port})
	if err != nil || len(rows) != 1 || rows[0].Label != "before" || !rows[0].Owner.Same(self(t)) {
		t.Errorf("after a refused Reopen, List(port %d) = %+v, %v; want the row reserved before, this process's", k.Port, rows, err)
	}
}
