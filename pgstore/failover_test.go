package pgstore_test

import (
	"context"
	"errors"
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

// TestRegistrationLost: a host whose row is lost (a failover to a standby
// that had not received it; here deleted by hand with its reservations)
// is registered again at its next renewal under its old number, and Check
// reports the loss until the holders say they dealt with it; when that
// number was taken meanwhile, the host takes a new one and goes on
// granting under it: no stale number stays cached.
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
	if err := a.Renew(ctx, time.Minute); err != nil {
		t.Fatalf("Renew after the host's row was lost = %v; want it registered again", err)
	}
	if got := hostNo(t, conn, "reg-a"); got != old {
		t.Errorf("reg-a's number after registering again = %d; want its old %d", got, old)
	}
	err := a.Check(ctx)
	var le *pgstore.LostError
	if !errors.As(err, &le) || !errors.Is(err, store.ErrLost) || le.Host != "reg-a" || le.Routine() {
		t.Fatalf("Check after the registration was lost = %v; want a *LostError, not routine", err)
	}
	reserveN(t, a, 56501, 1)
	a.Checked(err)
	if err := a.Check(ctx); err != nil {
		t.Errorf("Check after Checked = %v; want nil", err)
	}
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
	if err := a.Renew(ctx, time.Minute); err != nil {
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
	if err := a.Check(ctx); !errors.Is(err, store.ErrLost) {
		t.Errorf("Check after a new number = %v; want ErrLost", err)
	}
	// A plain renewal asks the holders to compare too, as routine.
	a.Checked(a.Check(ctx))
	if err := a.Renew(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(ctx); !errors.As(err, &le) || !le.Routine() {
		t.Errorf("Check after a plain renewal = %v; want a routine *LostError", err)
	}
}
