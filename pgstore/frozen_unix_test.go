//go:build unix

package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/pgcluster"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// TestFrozenServer: with every process of the server stopped (SIGSTOP),
// each call, the lease renewal and Open fail within Options.Timeout with
// errors that name the store (password hidden) and what timed out, and
// Close returns within Options.Timeout too, its connections closing in
// the background until the server answers again.
func TestFrozenServer(t *testing.T) {
	t0 := pgcluster.Guard(t, pw)
	c := pgcluster.Start(t)
	c.RequirePassword(t, pw)
	dsn := fmt.Sprintf("postgres://postgres:%s@/postgres?host=%s&sslmode=disable", pw, url.QueryEscape(c.Dir))
	const name = "PostgreSQL store postgres://postgres:xxxxx@/postgres?host="
	var logs pgcluster.LogBuffer
	const timeout = 300 * time.Millisecond
	const margin = time.Second
	opts := pgstore.Options{
		Host: "frozen", Timeout: timeout, SweepInterval: -1, LeaseTTL: 600 * time.Millisecond,
		Logger: logr.FromSlogHandler(slog.NewTextHandler(&logs, nil)),
	}
	ctx := context.Background()
	// The schema first, with time to spare on a loaded machine: opts'
	// Timeout bounds every round trip of the store under test.
	pre, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: "frozen", SweepInterval: -1, LeaseTTL: -1})
	if err != nil {
		t0.Fatalf("Open = %v", err)
	}
	if err := pre.Close(); err != nil {
		t0.Fatalf("Close = %v", err)
	}
	s, err := pgstore.Open(ctx, dsn, opts)
	if err != nil {
		t0.Fatalf("Open = %v", err)
	}
	if _, err := s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56001)}); err != nil {
		t0.Fatalf("Reserve = %v", err)
	}
	c.Freeze(t)

	check := func(what string, err error, took time.Duration, step string) {
		t.Helper()
		t0.Logf("%s with the server frozen: %v, after %v", what, err, took.Round(time.Millisecond))
		switch {
		case err == nil:
			t0.Errorf("%s with the server frozen = nil; want an error", what)
		case !errors.Is(err, store.ErrStorage):
			t0.Errorf("%s with the server frozen = %v; want ErrStorage", what, err)
		case !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), step):
			t0.Errorf("%s with the server frozen = %v; want it to name the store and say %q", what, err, step)
		}
		if took > timeout+margin {
			t0.Errorf("%s with the server frozen took %v; want at most Options.Timeout %v and %v", what, took, timeout, margin)
		}
	}
	start := time.Now()
	_, err = s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56002)})
	check("Reserve", err, time.Since(start), "reserve")
	start = time.Now()
	_, err = s.List(ctx, store.Filter{})
	check("List", err, time.Since(start), "list")

	// The renewal, every 200ms, fails and says so in the log.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "renew lease of") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if l := logs.String(); !strings.Contains(l, "renew lease of \\\"frozen\\\"") || !strings.Contains(l, name) {
		t0.Errorf("log with the server frozen:\n%s\nwant the failed renewal of the lease, naming the store", l)
	}

	start = time.Now()
	_, err = pgstore.Open(ctx, dsn, opts)
	check("Open", err, time.Since(start), "connect to")

	start = time.Now()
	err = s.Close()
	took := time.Since(start)
	t0.Logf("Close with the server frozen: %v, after %v", err, took.Round(time.Millisecond))
	if took > timeout+margin {
		t0.Errorf("Close with the server frozen took %v; want at most Options.Timeout %v and %v", took, timeout, margin)
	}
	if err != nil && !strings.Contains(err.Error(), name) {
		t0.Errorf("Close = %v; want it to name the store", err)
	}
	if strings.Contains(logs.String(), pw) {
		t0.Errorf("the log shows the password:\n%s", logs.String())
	}
	c.Thaw(t) // the connections Close left finish closing now
}
