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
		r, err := s.Scan(ctx, store.ScanRequest{
			Protocol: store.TCP,
			Addr:     loopback,
			Owner:    store.Owner{Holder: os.Getenv("BERTH_TEST_HOLDER")},
			TTL:      ttl,
			Label:    "job",
			Next: func() (uint16, bool) {
				p := port
				port++
				return p, int(p) <= hi
			},
			Probe: bindProbe,
		})
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

// holderRows returns the rows of holder, picked from all of the store's.
func holderRows(tb testing.TB, s store.Store, holder string) []store.Reservation {
	tb.Helper()
	var out []store.Reservation
	for _, r := range list(tb, s) {
		if r.Owner.Holder == holder {
			out = append(out, r)
		}
	}
	return out
}

// clockSkew is the rounding allowed between the lease clock and this
// process's monotonic clock, which run at one rate.
const clockSkew = time.Millisecond

// leaseEnd returns when the one lease of holder ends as the store tells it
// now (Reservation.Expires), and the earliest moment that can stand for:
// the store reads the lease clock and then this process's clock, so the
// time between the two reads may put Expires later, never earlier, and
// that time is at most what the whole List took.
func leaseEnd(tb testing.TB, s store.Store, holder string) (expires, earliest time.Time) {
	tb.Helper()
	start := time.Now()
	rows := holderRows(tb, s, holder)
	took := time.Since(start)
	if len(rows) != 1 || rows[0].Expires.IsZero() {
		tb.Fatalf("rows of %s = %+v; want one, with the end of its lease", holder, rows)
	}
	return rows[0].Expires, rows[0].Expires.Add(-took - clockSkew)
}

// checkLeaseEnd fails tb unless a lease of ttl granted between from and by
// ends, as leaseEnd tells, ttl after its grant.
func checkLeaseEnd(tb testing.TB, expires, earliest, from, by time.Time, ttl time.Duration) {
	tb.Helper()
	if expires.Before(from.Add(ttl-clockSkew)) || earliest.After(by.Add(ttl)) {
		tb.Errorf("a lease of %v, granted within %v, ends %v after its grant began (%v at the earliest); want %v after the grant",
			ttl, by.Sub(from), expires.Sub(from), earliest.Sub(from), ttl)
	}
}

// reapLease reaps until the lease that leaseEnd said ends at earliest is
// reaped, and fails tb if a Reap reaped it before then.
func reapLease(tb testing.TB, s store.Store, earliest time.Time) {
	tb.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n, err := s.Reap(context.Background())
		done := time.Now()
		if err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			if done.After(deadline) {
				tb.Fatalf("the lease was not reaped within 15 s")
			}
			continue
		}
		if n != 1 || done.Before(earliest) {
			tb.Errorf("Reap %v before the lease ends = %d; want 0", earliest.Sub(done), n)
		}
		return
	}
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
	before := time.Now()
	port := leaseBy(t, path, "ci/job-1", time.Hour)
	after := time.Now()
	s := openAt(t, path)
	if n, err := s.Reap(ctx); err != nil || n != 0 {
		t.Errorf("Reap = %d, %v; want 0 with the lease live", n, err)
	}
	_, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, port)})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Holder.Owner.Holder != "ci/job-1" || ce.Holder.Owner.PID != 0 {
		t.Fatalf("Reserve(%d) held by a lease = %v; want a ConflictError naming holder ci/job-1", port, err)
	}
	if !strings.Contains(err.Error(), `holder "ci/job-1"`) {
		t.Errorf("conflict message %q does not name the holder", err)
	}
	if _, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: loopback, Next: func() (uint16, bool) { return port, false }}); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Scan of the lease's port alone = %v; want ErrExhausted", err)
	}
	rows := holderRows(t, s, "ci/job-1")
	if len(rows) != 1 || rows[0].Port != port || rows[0].Label != "job" {
		t.Fatalf("rows of ci/job-1 = %+v; want port %d labelled job", rows, port)
	}
	expires, earliest := leaseEnd(t, s, "ci/job-1")
	checkLeaseEnd(t, expires, earliest, before, after, time.Hour)
	if filtered, err := s.List(ctx, store.Filter{Holder: "ci/job-1"}); err != nil || len(filtered) != 1 || filtered[0].Port != port {
		t.Errorf("List(holder ci/job-1) = %+v, %v; want its row", filtered, err)
	}

	// The row as a berth that knows no leases reads it: the owner columns
	// alone, judged as a process.
	var raw store.Owner
	if err := migrationsDB(t, path).QueryRow("SELECT owner_pid, owner_start, owner_scope FROM port_allocations WHERE port = ?", port).
		Scan(&raw.PID, &raw.Start, &raw.Namespace); err != nil {
		t.Fatal(err)
	}
	if !raw.Alive(ctx) {
		t.Errorf("a berth that knows no leases judges the lease's row owner %+v dead; it must keep the row", raw)
	}
	// Nor does a process filter of this store take it for a process's.
	if rows, err := s.List(ctx, store.Filter{OwnerPID: raw.PID}); err != nil || len(rows) != 0 {
		t.Errorf("List(pid %d) = %+v, %v; want no lease's row", raw.PID, rows, err)
	}
}

// TestLeaseRenewAndExpiry: Renew extends every live lease of its holder to
// its TTL from the renewal; the lease ends then, as Reservation.Expires
// tells, and is reaped, never before; a lease that has ended is never
// revived, it is released by its holder's name all the same, and its port
// goes to the next owner that asks.
func TestLeaseRenewAndExpiry(t *testing.T) {
	testports.Hold(t, testports.Statestore)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	const ttl = 2 * time.Second
	leaseBy(t, path, "dev", ttl)
	s := openAt(t, path)

	renewed := time.Now() // the renewal reads the lease clock after this
	if n, err := s.Renew(ctx, "dev", ttl); err != nil || n != 1 {
		t.Fatalf("Renew(dev) = %d, %v; want 1", n, err)
	}
	renewedBy := time.Now()
	if _, err := s.Renew(ctx, "nobody", ttl); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew(nobody) = %v; want ErrNotFound", err)
	}
	expires, earliest := leaseEnd(t, s, "dev")
	checkLeaseEnd(t, expires, earliest, renewed, renewedBy, ttl)
	reapLease(t, s, earliest)
	if _, err := s.Renew(ctx, "dev", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew after the lease ended = %v; want ErrNotFound", err)
	}

	// Ended leases not yet reaped: a renewal leaves them ended, the
	// holder's release deletes one, and the next owner takes the other's
	// port, reaping its row.
	first, second := uint16(29001), uint16(29002)
	for _, p := range []uint16{first, second} {
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, p), Owner: store.Owner{Holder: "dev"}, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	waitLeaseEnd(t, s, "dev")
	if _, err := s.Renew(ctx, "dev", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew of ended leases = %v; want ErrNotFound", err)
	}
	if err := s.Release(ctx, tcp(loopback, first), store.Owner{Holder: "dev"}); err != nil {
		t.Errorf("Release(%d) of an ended lease by its holder = %v; want it released", first, err)
	}
	reaped := s.Stats().Reaped
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, second)}); err != nil {
		t.Errorf("Reserve(%d) after its lease ended = %v; want it granted", second, err)
	}
	if got := s.Stats().Reaped - reaped; got != 1 {
		t.Errorf("rows reaped by the Reserve = %d; want the ended lease's", got)
	}
	if rows := holderRows(t, s, "dev"); len(rows) != 0 {
		t.Errorf("rows of dev after its ports were released and taken = %+v; want none", rows)
	}
}

// waitLeaseEnd waits until every lease of holder has ended as the store
// reads it, without reaping.
func waitLeaseEnd(tb testing.TB, s store.Store, holder string) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		live := false
		for _, r := range holderRows(tb, s, holder) {
			live = live || r.Live(context.Background())
		}
		if !live {
			return
		}
	}
	tb.Fatalf("the leases of %s did not end", holder)
}

// TestLeaseRelease: a holder's reservation is released by its holder's
// name alone: not by another holder, nor by the process that took it, nor
// by a process filter; a process's is not released by a holder's name.
func TestLeaseRelease(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	a, b := store.Owner{Holder: "env a"}, store.Owner{Holder: "env b"}
	for i, label := range []string{"web", "db", "web"} {
		if _, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, uint16(29100+i)), Owner: a, TTL: time.Hour, Label: label}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, 29110), Owner: b, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, 29111)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		port uint16
		own  store.Owner
	}{
		{29101, b},             // another holder
		{29101, store.Owner{}}, // the process that took it
		{29110, a},             // another holder's
		{29111, a},             // a process's
	} {
		if err := s.Release(ctx, tcp(loopback, tc.port), tc.own); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Release(%d) by %v = %v; want ErrNotFound", tc.port, tc.own, err)
		}
	}
	if err := s.Release(ctx, tcp(loopback, 29101), a); err != nil {
		t.Errorf("Release(29101) by its holder = %v", err)
	}
	ports := func(f store.Filter) []uint16 {
		t.Helper()
		rows, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint16
		for _, r := range rows {
			out = append(out, r.Port)
		}
		return out
	}
	for _, tc := range []struct {
		f    store.Filter
		want string
	}{
		{store.Filter{Holder: "env a"}, "[29100 29102]"},
		{store.Filter{Holder: "env a", Label: "web"}, "[29100 29102]"},
		{store.Filter{Holder: "env a", Label: "db"}, "[]"},
		{store.Filter{Holder: "env b"}, "[29110]"},
		{store.Filter{OwnerPID: os.Getpid()}, "[29111]"},
		{store.Filter{}, "[29100 29102 29110 29111]"},
	} {
		if got := formatPorts(ports(tc.f)); got != tc.want {
			t.Errorf("List(%+v) = %s; want %s", tc.f, got, tc.want)
		}
	}
}

func formatPorts(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// TestLeaseRequestChecked: bad holders and TTLs are refused with a
// FieldError naming the field, by every call that takes them, and nothing
// is written; a process's request carries no TTL, and an owner is a
// process or a holder, not both.
func TestLeaseRequestChecked(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	self, err := store.Self()
	if err != nil {
		t.Fatal(err)
	}
	key := tcp(loopback, 29200)
	for _, tc := range []struct {
		own   store.Owner
		ttl   time.Duration
		field string
	}{
		{store.Owner{Holder: "a\x1bb"}, time.Hour, "holder"},
		{store.Owner{Holder: strings.Repeat("h", store.MaxHolderLen+1)}, time.Hour, "holder"},
		{store.Owner{Holder: "ok"}, 0, "ttl"},
		{store.Owner{Holder: "ok"}, -time.Second, "ttl"},
		{store.Owner{Holder: "ok"}, 31 * 24 * time.Hour, "ttl"},
		{store.Owner{}, time.Hour, "ttl"},
		{self, time.Hour, "ttl"},
		{store.Owner{PID: self.PID, Holder: "ok"}, time.Hour, "owner"},
	} {
		var fe *store.FieldError
		if _, err := s.Reserve(ctx, store.Request{Key: key, Owner: tc.own, TTL: tc.ttl}); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("Reserve(%+v, ttl %v) = %v; want a FieldError for %s", tc.own, tc.ttl, err, tc.field)
		}
		next := func() (uint16, bool) { return key.Port, true }
		if _, err := s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: loopback, Owner: tc.own, TTL: tc.ttl, Next: next}); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("Scan(%+v, ttl %v) = %v; want a FieldError for %s", tc.own, tc.ttl, err, tc.field)
		}
		if _, err := s.ScanBlock(ctx, store.ScanRequest{Protocol: store.TCP, Addr: loopback, Owner: tc.own, TTL: tc.ttl, Next: next}, 2); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("ScanBlock(%+v, ttl %v) = %v; want a FieldError for %s", tc.own, tc.ttl, err, tc.field)
		}
	}
	for _, tc := range []struct {
		holder string
		ttl    time.Duration
		field  string
	}{
		{"", time.Hour, "holder"},
		{"a\nb", time.Hour, "holder"},
		{"ok", 0, "ttl"},
		{"ok", 31 * 24 * time.Hour, "ttl"},
	} {
		var fe *store.FieldError
		if _, err := s.Renew(ctx, tc.holder, tc.ttl); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("Renew(%q, %v) = %v; want a FieldError for %s", tc.holder, tc.ttl, err, tc.field)
		}
	}
	if rows := list(t, s); len(rows) != 0 {
		t.Errorf("rows after refused requests = %+v; want none", rows)
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
	if _, err := s.Reserve(ctx, store.Request{Key: tcp(loopback, 29300), Owner: store.Owner{Holder: "old"}, TTL: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("Reap of a lease of this boot = %d, %v; want 0", n, err)
	}
	if _, err := migrationsDB(t, path).Exec("UPDATE port_allocations SET owner_scope = replace(owner_scope, ?, '00000000-0000-0000-0000-000000000000')", owner.BootID()); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Reap(ctx); err != nil || n != 1 {
		t.Errorf("Reap of a lease of another boot = %d, %v; want 1", n, err)
	}
}
