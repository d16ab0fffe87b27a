package portalloc

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// storeRetry is how long a store that could not be used is left alone
// before a call tries it again; tests shorten it.
var storeRetryInterval = 5 * time.Second

func storeRetry() time.Duration { return storeRetryInterval }

// fallBack counts a switch of a to the MRU file for cause; the handle
// has logged it.
func (a *Allocator) fallBack(cause error) {
	if cause != nil {
		a.ctr.fallbacks.Add(1)
	}
}

// warnLogger is the Logger fallback warnings go to: cfg.Logger, or, when it
// is the zero Logger (which discards), standard error. A fallback weakens
// berth's guarantee, so it must not pass unseen.
func warnLogger(cfg Config) logr.Logger {
	if cfg.Logger.GetSink() != nil {
		return cfg.Logger
	}
	return logr.New(&lineSink{w: os.Stderr, prefix: "berth: "})
}

// lineSink writes Info and Error messages of level 0 as single lines.
type lineSink struct {
	mu     sync.Mutex // guards writes to w
	w      io.Writer
	prefix string
}

func (s *lineSink) Init(logr.RuntimeInfo)                  {}
func (s *lineSink) Enabled(level int) bool                 { return level == 0 }
func (s *lineSink) WithValues(...any) logr.LogSink         { return s }
func (s *lineSink) WithName(string) logr.LogSink           { return s }
func (s *lineSink) Info(_ int, msg string, kv ...any)      { s.line(msg, nil, kv) }
func (s *lineSink) Error(err error, msg string, kv ...any) { s.line("warning: "+msg, err, kv) }

func (s *lineSink) line(msg string, err error, kv []any) {
	var b strings.Builder
	b.WriteString(s.prefix)
	b.WriteString(msg)
	if err != nil {
		b.WriteString(": ")
		b.WriteString(err.Error())
	}
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	b.WriteByte('\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = io.WriteString(s.w, b.String())
}
