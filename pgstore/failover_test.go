package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// hostNo reads host's number, 0 when it has no row.
func hostNo(tb testing.TB, conn *pgx.Conn, host string) int32 {
	tb.Helper()
	var no int32
	err := conn.QueryRow(context.Background(), "SELECT host_no FROM berth_hosts WHERE host_id = $1", host).Scan(&no)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		tb.Fatal(err)
	}
	return no
}

// routine is what Check says when the only reason to compare is a
// renewal of the host's lease.
const routine = "(lease renewal)"

// TestRegistrationLost: a host whose row is lost (a failover to a standby
// that had not received it; here deleted by hand with its reservations)
// is registered again at its next renewal under its old number, and Check
// reports the loss once, naming it; when that number was taken meanwhile,
// the host takes a new one and goes on granting under it: no stale number
// stays cached. A routine renewal asks the holders to compare too, but
// never hides a loss they have not been told of.
func TestRegistrationLost(t *testing.T) {
	dsn, conn := testDB(t)
	ctx := context.Background()
	a := openWith(t, dsn, pgstore.Options{Host: "reg-a"})
	reserveN(t, a, 56500, 1)
	if err := a.Check(ctx); err != nil {
		t.Fatalf("Check right after Open = %v; want nil", err)
	}
	old := hostNo(t, conn, "reg-a")
	lose := func() {
		t.Helper()
		if _, err := conn.Exec(ctx, "DELETE FROM berth_port_allocations WHERE host_no = $1", old); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "DELETE FROM berth_hosts WHERE host_no = $1", old); err != nil {
			t.Fatal(err)
		}
	}
	lose()
	if err := a.RenewLease(ctx, time.Minute); err != nil {
		t.Fatalf("Renew after the host's row was lost = %v; want it registered again", err)
	}
	if got := hostNo(t, conn, "reg-a"); got != old {
		t.Errorf("reg-a's number after registering again = %d; want its old %d", got, old)
	}
	// A routine renewal before the holders were told does not hide it.
	if err := a.RenewLease(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	err := a.Check(ctx)
	if !errors.Is(err, store.ErrLost) || !strings.Contains(err.Error(), `host "reg-a"`) ||
		!strings.Contains(err.Error(), "registration was lost") || strings.Contains(err.Error(), routine) {
		t.Fatalf("Check after the registration was lost = %v; want ErrLost naming the lost registration, not routine", err)
	}
	if err := a.Check(ctx); err != nil {
		t.Errorf("Check once it said so = %v; want nil", err)
	}
	reserveN(t, a, 56501, 1)
	// A new host registered meanwhile takes the next number, not old.
	b := openWith(t, dsn, pgstore.Options{Host: "reg-b"})
	if got := hostNo(t, conn, "reg-b"); got == old {
		t.Errorf("a new host after reg-a registered again got its number %d", got)
	}
	reserveN(t, b, 56500, 1)

	// Lost again, and its number taken by another host.
	lose()
	if _, err := conn.Exec(ctx, "INSERT INTO berth_hosts (host_no, host_id, expires_at) OVERRIDING SYSTEM VALUE VALUES ($1, 'reg-z', now())", old); err != nil {
		t.Fatal(err)
	}
	if err := a.RenewLease(ctx, time.Minute); err != nil {
		t.Fatalf("Renew after the host's row was lost and its number taken = %v", err)
	}
	now := hostNo(t, conn, "reg-a")
	if now == 0 || now == old {
		t.Fatalf("reg-a's number after its old one was taken = %d; want a new one", now)
	}
	reserveN(t, a, 56502, 1)
	if got, z := rowsOf(t, conn, "reg-a"), rowsOf(t, conn, "reg-z"); got != 1 || z != 0 {
		t.Errorf("rows of reg-a, reg-z after a grant under the new number = %d, %d; want 1, 0", got, z)
	}
	if rows, err := a.List(ctx, store.Filter{}); err != nil || len(rows) != 1 || rows[0].Port != 56502 {
		t.Errorf("reg-a's List under its new number = %v, %v; want its one row, 56502", rows, err)
	}
	if err := a.Check(ctx); !errors.Is(err, store.ErrLost) || strings.Contains(err.Error(), routine) {
		t.Errorf("Check after a new number = %v; want ErrLost, not routine", err)
	}
	// A plain renewal asks the holders to compare too, as routine.
	if err := a.Check(ctx); err != nil {
		t.Errorf("Check once it said so = %v; want nil", err)
	}
	if err := a.RenewLease(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(ctx); !errors.Is(err, store.ErrLost) || !strings.Contains(err.Error(), routine) {
		t.Errorf("Check after a plain renewal = %v; want a routine ErrLost", err)
	}
	_ = a.Close()
	if err := a.Check(ctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Check after Close = %v; want ErrClosed", err)
	}
}
