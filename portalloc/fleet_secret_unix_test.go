//go:build unix

package portalloc_test

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
)

// secretPW is the password the tests below give the server and put in
// every form of connection string, and look for in everything berth
// shows.
const secretPW = "Sekr3t-PW-9f2"

// TestFleetStoreFrozen: with every process of the PostgreSQL server
// stopped (SIGSTOP: a partition, or a hung machine, as a client sees it),
// New, Allocate and Close each return, and their errors name the store,
// with its password hidden, and what timed out. New names the store it was
// given, never the SQLite file.
func TestFleetStoreFrozen(t *testing.T) {
	t0 := pgcluster.Guard(t, secretPW)
	c := pgcluster.Start(t)
	c.RequirePassword(t, secretPW)
	dsn := fmt.Sprintf("postgres://postgres:%s@/postgres?host=%s&sslmode=disable", secretPW, url.QueryEscape(c.Dir))
	var logs pgcluster.LogBuffer
	const timeout = time.Second
	cfg := portalloc.Config{
		StoreDSN: dsn, Host: "frozen", StateDir: t.TempDir(), Range: allocRange, AllowEphemeralOverlap: true,
		Timeout: timeout, Logger: portalloc.TextLogger(&logs, slog.LevelDebug), IgnoreEnv: true,
	}
	ctx := context.Background()
	a, err := fleet.New(ctx, cfg)
	if err != nil {
		t0.Fatalf("New = %v", err)
	}
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
	}

	start := time.Now()
	_, err = a.Allocate(ctx, portalloc.Request{Label: "frozen"})
	named("Allocate", err, time.Since(start), "scan for tcp")

	start = time.Now()
	err = a.Close()
	t0.Logf("Close with the server frozen: %v after %v", err, time.Since(start).Round(time.Millisecond))
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
	again, err := fleet.New(ctx, cfg)
	if err != nil {
		t0.Fatalf("New after the server answers again = %v", err)
	}
	if err := again.Close(); err != nil {
		t0.Errorf("Close after the server answers again = %v", err)
	}
}

// TestFleetSecretsNeverShown: whatever form a connection string takes
// (URL user information, a password query parameter, a key=value
// password quoted or not, several hosts, PGPASSWORD), and whether the
// server accepts it, refuses the password, or cannot be reached, or the
// scheme is mistyped, neither New's error, nor the log at debug level, nor
// %v, %+v, %#v or %s of the errors and of the Config, shows the password.
func TestFleetSecretsNeverShown(t *testing.T) {
	c := pgcluster.Start(t)
	c.RequirePassword(t, secretPW)
	sock := url.QueryEscape(c.Dir)
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
				StoreDSN: tc.dsn, Host: "secretive", StateDir: t.TempDir(), Range: allocRange, AllowEphemeralOverlap: true,
				Timeout: 5 * time.Second, Logger: portalloc.TextLogger(&logs, slog.LevelDebug), IgnoreEnv: true,
			}
			var shown []string
			show := func(format string, args ...any) { shown = append(shown, fmt.Sprintf(format, args...)) }
			show("%v|%+v|%#v|%s", cfg, cfg, cfg, cfg)
			show("%v|%+v|%#v", &cfg, &cfg, []portalloc.Config{cfg})
			a, err := fleet.New(context.Background(), cfg)
			if (err == nil) != tc.ok {
				t1.Errorf("New = %v; want success %v", err, tc.ok)
			}
			if err != nil {
				show("%v|%+v|%#v|%s", err, err, err, err)
				for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
					show("%v", e) // what a caller unwrapping to the store's error prints
				}
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
			show("%s", logs.String())
			for _, s := range shown {
				if strings.Contains(s, secretPW) {
					t1.Errorf("shown: %s", s) // the guard hides it, and fails
				}
			}
			if err != nil {
				t1.Logf("New = %v", err)
			}
		})
	}
}
