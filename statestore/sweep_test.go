package statestore_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/statestore"
)

// A Close that meets the background sweep in flight ends it quietly: the
// sweep's "store closed" is no failure to warn about (every short-lived
// `berth get` printed one now and then).
func TestCloseDuringSweepLogsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	for i := range 40 {
		var (
			mu   sync.Mutex
			logs []string
		)
		log := funcr.New(func(prefix, args string) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, prefix+" "+args)
		}, funcr.Options{})
		s, err := statestore.Open(context.Background(), path, statestore.Options{SweepInterval: time.Millisecond, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%5) * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		for _, l := range logs {
			if strings.Contains(l, "failed") {
				t.Errorf("Close during a sweep logged %s", l)
			}
		}
		mu.Unlock()
	}
}
