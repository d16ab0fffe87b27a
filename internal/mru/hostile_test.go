package mru_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/internal/testproc"
)

// The test binary doubles as an appending worker: in the role "append" it
// records ports into the file BERTH_MRU_PATH one call at a time, printing
// each after the call returned, until it is killed.
func init() {
	testproc.Register("append", func() int {
		f := mru.New(os.Getenv("BERTH_MRU_PATH"), mru.Options{MaxEntries: 100000, Window: time.Hour})
		for p := 1; ; p = p%65535 + 1 {
			if err := f.Record(context.Background(), "tcp", uint16(p)); err != nil {
				fmt.Println("error:", err)
				return 1
			}
			fmt.Println(p)
		}
	})
}

func TestMain(m *testing.M) {
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}

// TestTornLastLine: a file cut at any byte, as a crash in the middle of an
// append could leave it, loses at most the line being written: every whole
// line before the cut is still remembered, and the next append goes on from
// the last whole line.
func TestTornLastLine(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	full := filepath.Join(dir, "full.json")
	f := mru.New(full, mru.Options{})
	for p := uint16(30000); p < 30010; p++ {
		if err := f.Record(ctx, "tcp", p); err != nil {
			t.Fatal(err)
		}
	}
	b := mustRead(t, full)
	header := strings.IndexByte(string(b), '\n') + 1
	for cut := header; cut <= len(b); cut++ {
		path := filepath.Join(dir, "cut"+strconv.Itoa(cut)+".json")
		if err := os.WriteFile(path, b[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		whole := strings.Count(string(b[header:cut]), "\n")
		g := mru.New(path, mru.Options{})
		es, err := g.Entries(ctx)
		if err != nil || len(es) != whole {
			t.Fatalf("cut at %d: Entries = %d entries, %v; want the %d whole lines", cut, len(es), err, whole)
		}
		if err := g.Record(ctx, "tcp", 31000); err != nil {
			t.Fatal(err)
		}
		es, err = mru.Parse(mustRead(t, path))
		if err != nil || len(es) != whole+1 || es[len(es)-1].Port != 31000 {
			t.Fatalf("cut at %d, then a Record: file parses to %d entries, %v; want %d ending with 31000", cut, len(es), err, whole+1)
		}
	}
}

// TestKilledWhileAppending: a process SIGKILLed at random moments while it
// records ports leaves a file that parses, with every port it had finished
// recording; then a compaction (rewrite) keeps the file whole too.
func TestKilledWhileAppending(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("uses SIGKILL")
	}
	path := filepath.Join(t.TempDir(), "mru.json")
	for try := range 20 {
		cmd := testproc.Command(t, "append")
		cmd.Env = append(cmd.Env, "BERTH_MRU_PATH="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		done := map[uint16]bool{}
		for n := 0; n < 50+try*20 && sc.Scan(); n++ {
			p, err := strconv.Atoi(sc.Text())
			if err != nil {
				t.Fatalf("worker said %q", sc.Text())
			}
			done[uint16(p)] = true
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		es, err := mru.Parse(mustRead(t, path))
		if err != nil {
			t.Fatalf("try %d: file after a kill does not parse: %v", try, err)
		}
		have := map[uint16]bool{}
		for _, e := range es {
			have[e.Port] = true
		}
		for p := range done {
			if !have[p] {
				t.Fatalf("try %d: port %d was recorded before the kill and is missing", try, p)
			}
		}
	}
}

// TestVersion1Read: a file of the earlier format is read, its ports are
// skipped, and it is rewritten in the current format.
func TestVersion1Read(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "mru.json")
	now := time.Now().UnixMilli()
	v1 := fmt.Sprintf(`{"format":"berth-mru","version":1,"entries":[{"protocol":"tcp","port":30000,"at":%d}]}`, now)
	if err := os.WriteFile(path, []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	f := mru.New(path, mru.Options{})
	p, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000, 30001), Probe: free})
	if err != nil || p != 30001 {
		t.Fatalf("Allocate = %d, %v; want 30001 (30000 is recent in the version 1 file)", p, err)
	}
	b := mustRead(t, path)
	if !strings.HasPrefix(string(b), `{"format":"berth-mru","version":2}`) {
		t.Errorf("file after a write = %q; want version 2", b)
	}
	if es, err := mru.Parse(b); err != nil || len(es) != 2 {
		t.Errorf("Parse = %v, %v; want both ports", es, err)
	}
}

// logSink collects log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *logSink) logger() logr.Logger {
	return funcr.New(func(_, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lines = append(s.lines, args)
	}, funcr.Options{})
}

func (s *logSink) has(sub string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Contains(strings.Join(s.lines, "\n"), sub)
}
