package portalloc_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/portalloc"
)

// lines is a Logger's output, for tests.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.all = append(l.all, args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: 1})
}

func (l *lines) has(phrase string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.all {
		if strings.Contains(s, phrase) {
			return true
		}
	}
	return false
}

// TestSharedStoreLogsToEveryAllocator: the Allocators of a process share
// one handle per store, and what it logs (here, a lost store put back)
// reaches the Logger of each of them, not the first one's only; an
// Allocator closed is told nothing more.
func TestSharedStoreLogsToEveryAllocator(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var la, lb, lc lines
	a := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Logger: la.logger()})
	b := newAllocator(t, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Logger: lb.logger()})
	c, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Range: allocRange, Logger: lc.logger(), IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, portalloc.Request{Label: "logged"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "berth.db")); err != nil {
		t.Fatal(err)
	}
	const phrase = "the store lost this process's reservations"
	for deadline := time.Now().Add(10 * time.Second); !la.has(phrase) || !lb.has(phrase); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the store was lost: a's log has it %v, b's %v; want both", la.has(phrase), lb.has(phrase))
		}
	}
	if lc.has(phrase) {
		t.Error("a closed Allocator's Logger was told of the loss")
	}
	_ = b
}
