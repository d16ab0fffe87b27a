package pgstore_test

import (
	"context"
	"testing"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// TestConformance runs the suite every berth store passes, each case in a
// schema of its own.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		t.Helper()
		dsn, _ := testDB(t)
		s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Host: "conformance"})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}
