//go:build unix

package pgstore_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// TestServerThatDoesNotAnswer: a server that stops answering (here: the
// store's backend process stopped, as a network partition looks from the
// client) fails the call with ErrStorage after Options.Timeout, and the
// store works again once the server does.
func TestServerThatDoesNotAnswer(t *testing.T) {
	dsn, conn := testDB(t)
	dsn = pgschema.WithParam(pgschema.WithParam(dsn, "application_name", "berth-hang"), "pool_max_conns", "1")
	ctx := context.Background()
	s, err := pgstore.Open(ctx, dsn, pgstore.Options{Host: "h1", Timeout: 500 * time.Millisecond, SweepInterval: -1, LeaseTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.List(ctx, store.Filter{}); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = 'berth-hang'").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop the server's backend %d: %v", pid, err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	start := time.Now()
	_, err = s.Reserve(ctx, store.Request{Key: key(store.TCP, "127.0.0.1", 56000)})
	took := time.Since(start)
	if !errors.Is(err, store.ErrStorage) {
		t.Errorf("Reserve with the server stopped = %v; want ErrStorage", err)
	}
	t.Logf("Reserve with the server stopped failed after %v: %v", took.Round(time.Millisecond), err)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.List(ctx, store.Filter{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List after the server answers again = %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
