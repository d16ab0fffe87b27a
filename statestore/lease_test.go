package statestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/internal/probe"
	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func init() {
	// lease: take a port of BERTH_TEST_LO to BERTH_TEST_HI for the holder
	// BERTH_TEST_HOLDER under a lease of BERTH_TEST_TTL, report it, and
	// exit at once: the port must outlive this process.
	extraWorkers["lease"] = func(ctx context.Context, db string, out *json.Encoder, _ func()) error {
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return err
		}
		defer s.Close()
		lo, _ := strconv.Atoi(os.Getenv("BERTH_TEST_LO"))
		hi, _ := strconv.Atoi(os.Getenv("BERTH_TEST_HI"))
		ttl, err := time.ParseDuration(os.Getenv("BERTH_TEST_TTL"))
		if err != nil {
			return err
		}
		port := uint16(lo)
		r, err := s.ScanLease(ctx, statestore.ScanRequest{
			Protocol: statestore.TCP,
			Addr:     loopback,
			Label:    "job",
			Next: func() (uint16, bool) {
				p := port
				port++
				return p, int(p) <= hi
			},
			Probe: func(k statestore.Key) (bool, error) { return probe.Available(string(k.Protocol), k.Addr, k.Port) },
		}, statestore.Lease{Holder: os.Getenv("BERTH_TEST_HOLDER"), TTL: ttl})
		if err != nil {
			return out.Encode(event{Event: "error", Error: err.Error()})
		}
		return out.Encode(event{Event: "grant", Port: r.Port})
	}
}

// leaseBy has a worker process take a port for holder under a lease of
// ttl; the worker has exited when it returns.
func leaseBy(tb testing.TB, path, holder string, ttl time.Duration) uint16 {
	tb.Helper()
	r := testports.Statestore
	w := startWorker(tb, "lease", path, "BERTH_TEST_HOLDER="+holder, "BERTH_TEST_TTL="+ttl.String(),
		"BERTH_TEST_LO="+strconv.Itoa(int(r.First)), "BERTH_TEST_HI="+strconv.Itoa(int(r.Last)))
	e := w.until(tb, "grant")
	if err := w.cmd.Wait(); err != nil {
		tb.Fatalf("lease worker: %v", err)
	}
	return e[len(e)-1].Port
}

// holderRows returns the rows of holder.
func holderRows(tb testing.TB, s *statestore.Store, holder string) []statestore.Reservation {
	tb.Helper()
	var out []statestore.Reservation
	for _, r := range list(tb, s) {
		if r.Owner.IsLease() && r.Owner.Name == holder {
			out = append(out, r)
		}
	}
	return out
}

// TestLeaseOutlivesProcess: a port a holder took under a lease stays
// reserved after the process that asked has exited: another process cannot
// reserve it (it learns the holder's name), and neither Reap nor a scan
// reaps it. A berth that knows no leases, judging the row's owner as a
// process, keeps it too.
func TestLeaseOutlivesProcess(t *testing.T) {
	testports.Hold(t, testports.Statestore)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	port := leaseBy(t, path, "ci/job-1", time.Hour)
	s := openAt(t, path)
	if n, err := s.Reap(ctx); err != nil || n != 0 {
		t.Errorf("Reap = %d, %v; want 0 with the lease live", n, err)
	}
	_, err := s.Reserve(ctx, statestore.Request{Key: tcp(loopback, port)})
	var ce *statestore.ConflictError
	if !errors.As(err, &ce) || !ce.Holder.Owner.IsLease() || ce.Holder.Owner.Name != "ci/job-1" {
		t.Fatalf("Reserve(%d) held by a lease = %v; want a ConflictError naming holder ci/job-1", port, err)
	}
	if !strings.Contains(err.Error(), `lease "ci/job-1"`) {
		t.Errorf("conflict message %q does not name the holder", err)
	}
	rows := holderRows(t, s, "ci/job-1")
	if len(rows) != 1 || rows[0].Port != port || rows[0].Label != "job" {
		t.Fatalf("rows of ci/job-1 = %+v; want port %d labelled job", rows, port)
	}
	if left := time.Until(rows[0].Expires); left < 59*time.Minute || left > time.Hour {
		t.Errorf("lease has %v left; want about 1h", left)
	}

	// The row as a berth that knows no leases reads it: the owner columns
	// alone, judged as a process.
	var raw store.Owner
	if err := migrationsDB(t, path).QueryRow("SELECT owner_pid, owner_start, owner_scope FROM port_allocations WHERE port = ?", port).
		Scan(&raw.PID, &raw.Start, &raw.Scope); err != nil {
		t.Fatal(err)
	}
	if !raw.Alive(ctx) {
		t.Errorf("a berth that knows no leases judges the lease's row owner %+v dead; it must keep the row", raw)
	}
}

// TestLeaseRenewAndExpiry: a lease ends on time, not before; RenewLease
// extends every live lease of its holder; a lease that has ended is never
// revived, and its port goes to the next owner that asks.
func TestLeaseRenewAndExpiry(t *testing.T) {
	testports.Hold(t, testports.Statestore)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	const ttl = 2 * time.Second
	start := time.Now()
	leaseBy(t, path, "dev", ttl)
	s := openAt(t, path)

	renewed := time.Now() // the renewal reads the lease clock after this
	if n, err := s.RenewLease(ctx, "dev", ttl); err != nil || n != 1 {
		t.Fatalf("RenewLease(dev) = %d, %v; want 1", n, err)
	}
	if _, err := s.RenewLease(ctx, "nobody", ttl); !errors.Is(err, statestore.ErrNotFound) {
		t.Errorf("RenewLease(nobody) = %v; want ErrNotFound", err)
	}
	// Live until ttl after the renewal, then reaped within a moment.
	var ended time.Time
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n, err := s.Reap(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			ended = time.Now()
			break
		}
	}
	switch {
	case ended.IsZero():
		t.Fatalf("the lease of %v taken at %v was never reaped", ttl, start)
	case ended.Sub(renewed) < ttl:
		t.Errorf("the lease ended %v after its renewal; want no sooner than %v", ended.Sub(renewed), ttl)
	case ended.Sub(renewed) > ttl+time.Second:
		t.Errorf("the lease ended %v after its renewal; want within a second of %v", ended.Sub(renewed), ttl)
	}
	if _, err := s.RenewLease(ctx, "dev", time.Hour); !errors.Is(err, statestore.ErrNotFound) {
		t.Errorf("RenewLease after the lease ended = %v; want ErrNotFound", err)
	}

	// An ended lease not yet reaped: renewal leaves it ended, and the next
	// owner takes its port.
	port := leaseBy(t, path, "dev", time.Second)
	waitLeaseEnd(t, s, "dev")
	if _, err := s.RenewLease(ctx, "dev", time.Hour); !errors.Is(err, statestore.ErrNotFound) {
		t.Errorf("RenewLease of an ended lease = %v; want ErrNotFound", err)
	}
	if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(loopback, port)}); err != nil {
		t.Errorf("Reserve(%d) after its lease ended = %v; want it granted", port, err)
	}
	if rows := holderRows(t, s, "dev"); len(rows) != 0 {
		t.Errorf("rows of dev after its port was taken = %+v; want none", rows)
	}
}

// waitLeaseEnd waits until every lease of holder has ended as the store
// reads it, without reaping.
func waitLeaseEnd(tb testing.TB, s *statestore.Store, holder string) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		live := false
		for _, r := range holderRows(tb, s, holder) {
			live = live || r.LeaseLive()
		}
		if !live {
			return
		}
	}
	tb.Fatalf("the leases of %s did not end", holder)
}

// TestLeaseRelease: ReleaseLease deletes the rows of its holder that match,
// and no other holder's or process's.
func TestLeaseRelease(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	l := statestore.Lease{Holder: "env a", TTL: time.Hour}
	for i, label := range []string{"web", "db", "web"} {
		if _, err := s.ReserveLease(ctx, statestore.Request{Key: tcp(loopback, uint16(29100+i)), Label: label}, l); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ReserveLease(ctx, statestore.Request{Key: tcp(loopback, 29110)}, statestore.Lease{Holder: "env b", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(loopback, 29111)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		f    statestore.Filter
		want int
	}{
		{statestore.Filter{Port: 29101}, 1},
		{statestore.Filter{Label: "web"}, 2},
		{statestore.Filter{}, 0},
	} {
		n, err := s.ReleaseLease(ctx, "env a", tc.f)
		if tc.want == 0 {
			if !errors.Is(err, statestore.ErrNotFound) {
				t.Errorf("ReleaseLease(env a, %+v) with nothing left = %d, %v; want ErrNotFound", tc.f, n, err)
			}
			continue
		}
		if err != nil || n != tc.want {
			t.Errorf("ReleaseLease(env a, %+v) = %d, %v; want %d", tc.f, n, err, tc.want)
		}
	}
	if rows := list(t, s); len(rows) != 2 {
		t.Errorf("rows left = %+v; want env b's and this process's", rows)
	}
}

// TestLeaseRequestChecked: bad holders and TTLs are refused with a
// FieldError naming the field; a lease's owner cannot be smuggled into a
// process request.
func TestLeaseRequestChecked(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	key := tcp(loopback, 29200)
	for _, tc := range []struct {
		l     statestore.Lease
		field string
	}{
		{statestore.Lease{Holder: "", TTL: time.Hour}, "holder"},
		{statestore.Lease{Holder: "a\x1bb", TTL: time.Hour}, "holder"},
		{statestore.Lease{Holder: strings.Repeat("h", 256), TTL: time.Hour}, "holder"},
		{statestore.Lease{Holder: "ok", TTL: 0}, "ttl"},
		{statestore.Lease{Holder: "ok", TTL: -time.Second}, "ttl"},
		{statestore.Lease{Holder: "ok", TTL: 31 * 24 * time.Hour}, "ttl"},
	} {
		_, err := s.ReserveLease(ctx, statestore.Request{Key: key}, tc.l)
		var fe *statestore.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("ReserveLease(%+v) = %v; want a FieldError for %s", tc.l, err, tc.field)
		}
	}
	self, _ := statestore.Self()
	if _, err := s.ReserveLease(ctx, statestore.Request{Key: key, Owner: self}, statestore.Lease{Holder: "ok", TTL: time.Hour}); !errors.Is(err, statestore.ErrInvalid) {
		t.Errorf("ReserveLease with an owner = %v; want ErrInvalid", err)
	}
	if _, err := s.Reserve(ctx, statestore.Request{Key: key, Owner: store.Owner{Scope: store.LeaseScope, Name: "ok"}}); !errors.Is(err, statestore.ErrInvalid) {
		t.Errorf("Reserve with a lease owner = %v; want ErrInvalid", err)
	}
}

// TestLeaseOfAnotherBoot: a lease recorded in another boot has ended,
// however long its TTL: its row is reaped.
func TestLeaseOfAnotherBoot(t *testing.T) {
	if owner.BootID() == "" {
		t.Skip("this system has no boot id")
	}
	ctx := context.Background()
	s, path := open(t)
	if _, err := s.ReserveLease(ctx, statestore.Request{Key: tcp(loopback, 29300)}, statestore.Lease{Holder: "old", TTL: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := migrationsDB(t, path).Exec("UPDATE port_allocations SET owner_scope = replace(owner_scope, ?, '00000000-0000-0000-0000-000000000000')", owner.BootID()); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Reap(ctx); err != nil || n != 1 {
		t.Errorf("Reap of a lease of another boot = %d, %v; want 1", n, err)
	}
}
