//go:build unix

package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/pgcluster"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/store"
)

// secretPW is the password the tests below give the server and put in
// every form of connection string, and look for in everything berth
// shows.
const secretPW = "Sekr3t-PW-9f2"

// margin is what a bounded call may take beyond its timeout on a loaded
// machine.
const margin = 1500 * time.Millisecond

// TestFleetStoreFrozen: with every process of the PostgreSQL server
// stopped (SIGSTOP: a partition, or a hung machine, as a client sees it),
// fleet.New, Allocate and Close each return within Config.Timeout and a
// small margin, and their errors name the store, with its password hidden,
// and what timed out. New names the store it was given, never a SQLite
// file.
func TestFleetStoreFrozen(t *testing.T) {
	t0 := pgcluster.Guard(t, secretPW)
	base := freeRun(t, 4)
	c := pgcluster.Start(t)
	c.RequirePassword(t, secretPW)
	dsn := fmt.Sprintf("postgres://postgres:%s@/postgres?host=%s&sslmode=disable", secretPW, url.QueryEscape(c.Dir))
	var logs pgcluster.LogBuffer
	const timeout = time.Second
	cfg := portalloc.Config{
		StoreDSN: dsn, Host: "frozen", StateDir: t.TempDir(), Range: store.Range{First: base, Last: base + 3}, IgnoreEnv: true,
		Timeout: timeout, Logger: portalloc.TextLogger(&logs, slog.LevelDebug),
	}
	ctx := context.Background()
	// The schema first, with time to spare on a loaded machine: the
	// Allocator's Timeout below bounds its every call.
	pre := cfg
	pre.Timeout = time.Minute
	s, err := fleet.Open(ctx, pre)
	if err != nil {
		t0.Fatalf("Open = %v", err)
	}
	if err := s.Close(); err != nil {
		t0.Fatalf("Close = %v", err)
	}
	a := newWithin(t0, cfg)
	if _, err := a.Allocate(ctx, portalloc.Request{Label: "before"}); err != nil {
		t0.Fatalf("Allocate = %v", err)
	}
	c.Freeze(t)

	named := func(what string, err error, took time.Duration, step string) {
		t.Helper()
		t0.Logf("%s with the server frozen: %v after %v", what, err, took.Round(time.Millisecond))
		msg := fmt.Sprintf("%v", err)
		switch {
		case err == nil:
			t0.Errorf("%s with the server frozen = nil; want an error", what)
		case !strings.Contains(msg, "PostgreSQL store postgres://postgres:xxxxx@/postgres"):
			t0.Errorf("%s with the server frozen = %q; want it to name the store, password hidden", what, msg)
		case strings.Contains(msg, "berth.db"):
			t0.Errorf("%s with the server frozen = %q; names the SQLite file, not the store it was given", what, msg)
		case !strings.Contains(msg, step):
			t0.Errorf("%s with the server frozen = %q; want it to say %q timed out", what, msg, step)
		}
		if took > timeout+margin {
			t0.Errorf("%s with the server frozen took %v; want at most Timeout %v and %v", what, took, timeout, margin)
		}
	}

	start := time.Now()
	_, err = a.Allocate(ctx, portalloc.Request{Label: "frozen"})
	named("Allocate", err, time.Since(start), "scan for tcp")

	start = time.Now()
	err = a.Close()
	took := time.Since(start)
	t0.Logf("Close with the server frozen: %v after %v", err, took.Round(time.Millisecond))
	if took > timeout+margin {
		t0.Errorf("Close with the server frozen took %v; want at most Timeout %v and %v", took, timeout, margin)
	}
	if err != nil && strings.Contains(err.Error(), "berth.db") {
		t0.Errorf("Close = %v; names the SQLite file", err)
	}

	for i := range 3 { // the name was once set after a race
		start = time.Now()
		b, err := fleet.New(ctx, cfg)
		if b != nil {
			_ = b.Close()
		}
		named(fmt.Sprintf("New #%d", i+1), err, time.Since(start), "connect")
		if !errors.Is(err, store.ErrUnavailable) {
			t0.Errorf("New #%d with the server frozen = %v; want it to wrap ErrUnavailable", i+1, err)
		}
	}
	// A deadline of the caller's own ends New the same way.
	dctx, cancel := context.WithTimeout(ctx, timeout/2)
	defer cancel()
	start = time.Now()
	_, err = fleet.New(dctx, cfg)
	named("New with a deadline of the caller's", err, time.Since(start), "connect")
	if !errors.Is(err, context.DeadlineExceeded) {
		t0.Errorf("New past the caller's deadline = %v; want it to wrap context.DeadlineExceeded", err)
	}

	c.Thaw(t)
	if strings.Contains(logs.String(), secretPW) {
		t0.Errorf("the log shows the password:\n%s", logs.String())
	}
	// Once the server answers, the store works again.
	again := newWithin(t0, cfg)
	if _, err := again.Allocate(ctx, portalloc.Request{Label: "after"}); err != nil {
		t0.Errorf("Allocate after the server answers again = %v", err)
	}
	if err := again.Close(); err != nil {
		t0.Errorf("Close after the server answers again = %v", err)
	}
}

// newWithin returns fleet.New's Allocator for cfg, whose Timeout bounds
// New's opening of the store too: on a loaded machine a server that
// answers may take longer than that to open a store, so New is tried
// again, up to 5 times, when it ran out of time.
func newWithin(tb testing.TB, cfg portalloc.Config) *portalloc.Allocator {
	tb.Helper()
	for i := 1; ; i++ {
		a, err := fleet.New(context.Background(), cfg)
		if err == nil {
			return a
		}
		if i == 5 || !errors.Is(err, context.DeadlineExceeded) {
			tb.Fatalf("New (try %d) = %v", i, err)
		}
		tb.Logf("New (try %d) = %v; trying again", i, err)
	}
}

// TestFleetSecretsNeverShown: whatever form a connection string takes
// (URL user information, a password query parameter, a key=value
// password quoted or not, several hosts, PGPASSWORD), and whether the
// server accepts it, refuses the password, or cannot be reached, or the
// scheme is mistyped, neither New's and Open's errors, nor the log at
// debug level, nor %v, %+v, %#v or %s of the errors, of the Config and of
// what the Allocator grants, shows the password.
func TestFleetSecretsNeverShown(t *testing.T) {
	base := freeRun(t, 4)
	c := pgcluster.Start(t)
	c.RequirePassword(t, secretPW)
	sock := url.QueryEscape(c.Dir)
	// The schema first, with time to spare on a loaded machine.
	pre, err := fleet.Open(context.Background(), portalloc.Config{StoreDSN: c.DSN + " password=" + secretPW, Host: "secretive", IgnoreEnv: true, Timeout: time.Minute})
	if err != nil {
		t.Fatal(strings.ReplaceAll(err.Error(), secretPW, "<secret>"))
	}
	if err := pre.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dsn  string
		pgpassword string // PGPASSWORD, when set
		ok         bool   // New succeeds
	}{
		{"URL user information", "postgres://postgres:" + secretPW + "@/postgres?host=" + sock, "", true},
		{"URL password parameter", "postgresql://postgres@/postgres?host=" + sock + "&password=" + secretPW, "", true},
		{"key=value", c.DSN + " password=" + secretPW, "", true},
		{"key=value quoted", c.DSN + " password = '" + secretPW + "'", "", true},
		{"several hosts in the query", "postgres://postgres:" + secretPW + "@/postgres?host=/nonexistent-dir," + sock, "", true},
		{"PGPASSWORD", c.DSN, secretPW, true},
		{"wrong password in the URL", "postgres://postgres:x" + secretPW + "@/postgres?host=" + sock, "", false},
		{"wrong password parameter", "postgres://postgres@/postgres?host=" + sock + "&password=x" + secretPW, "", false},
		{"wrong password key=value", c.DSN + " password='x " + secretPW + "'", "", false},
		{"wrong PGPASSWORD", c.DSN, "x" + secretPW, false},
		{"several hosts, none there", "postgres://postgres:" + secretPW + "@nohost.invalid:5432,otherhost.invalid:5433/postgres?connect_timeout=2", "", false},
		{"bad host", "host=nohost.invalid password=" + secretPW + " connect_timeout=2", "", false},
		{"no database", c.DSN + " dbname=nosuchdb password=" + secretPW, "", false},
		{"mistyped scheme", "postgre://postgres:" + secretPW + "@/postgres?host=" + sock, "", false},
		{"upper-case scheme", "POSTGRES://postgres:" + secretPW + "@/postgres?host=" + sock, "", false},
		{"misspelt key", c.DSN + " passwd=" + secretPW, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t1 := pgcluster.Guard(t, secretPW)
			if tc.pgpassword != "" {
				t.Setenv("PGPASSWORD", tc.pgpassword)
			}
			var logs pgcluster.LogBuffer
			cfg := portalloc.Config{
				StoreDSN: tc.dsn, Host: "secretive", StateDir: t.TempDir(), Range: store.Range{First: base, Last: base + 3}, IgnoreEnv: true,
				Timeout: 5 * time.Second, Logger: portalloc.TextLogger(&logs, slog.LevelDebug),
			}
			var shown []string
			show := func(format string, args ...any) { shown = append(shown, fmt.Sprintf(format, args...)) }
			showErr := func(err error) {
				show("%v|%+v|%#v|%s", err, err, err, err)
				for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
					show("%v", e) // what a caller unwrapping to the store's error prints
				}
			}
			show("%v|%+v|%#v|%s", cfg, cfg, cfg, cfg)
			show("%v|%+v|%#v", &cfg, &cfg, []portalloc.Config{cfg})
			a, err := fleet.New(context.Background(), cfg)
			if (err == nil) != tc.ok {
				t1.Errorf("New = %v; want success %v", err, tc.ok)
			}
			if err != nil {
				showErr(err)
			}
			if a != nil {
				show("%v|%+v|%#v", a.Config(), a.Config(), a.Config())
				show("%+v", a.Stats())
				if r, err := a.Allocate(context.Background(), portalloc.Request{Label: "secret"}); err != nil {
					t1.Errorf("Allocate = %v", err)
				} else {
					show("%v|%+v", r, r)
				}
				if err := a.Close(); err != nil {
					t1.Errorf("Close = %v", err)
				}
			}
			s, err := fleet.Open(context.Background(), cfg)
			if (err == nil) != tc.ok {
				t1.Errorf("Open = %v; want success %v", err, tc.ok)
			}
			if err != nil {
				showErr(err)
			} else {
				_ = s.Close()
			}
			show("%s", logs.String())
			for _, s := range shown {
				if strings.Contains(s, secretPW) {
					t1.Errorf("shown: %s", s) // the guard hides it, and fails
				}
			}
		})
	}
}
