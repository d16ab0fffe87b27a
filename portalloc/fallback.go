package portalloc

import (
	"fmt"
	"io"
	"os"
	"slices"
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

// logFan fans a handle's log out to the Loggers of every Allocator that
// shares it, each with its own levels.
type logFan struct {
	mu sync.Mutex
	by map[any][2]logr.Logger // log and warn, by Allocator
}

func (f *logFan) add(who any, log, warn logr.Logger) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil {
		f.by = map[any][2]logr.Logger{}
	}
	f.by[who] = [2]logr.Logger{log, warn}
}

func (f *logFan) remove(who any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.by, who)
}

// loggers returns the handle's log and warn.
func (f *logFan) loggers() (log, warn logr.Logger) {
	return logr.New(&fanSink{f: f, which: 0}), logr.New(&fanSink{f: f, which: 1})
}

func (f *logFan) each(which int, fn func(logr.Logger)) {
	f.mu.Lock()
	ls := make([]logr.Logger, 0, len(f.by))
	for _, l := range f.by {
		ls = append(ls, l[which])
	}
	f.mu.Unlock()
	for _, l := range ls {
		fn(l)
	}
}

// fanSink is the LogSink of a handle's log (which 0) or warn (1).
type fanSink struct {
	f      *logFan
	which  int
	values []any
}

func (s *fanSink) Init(logr.RuntimeInfo) {}
func (s *fanSink) Enabled(level int) bool {
	on := false
	s.f.each(s.which, func(l logr.Logger) { on = on || l.V(level).Enabled() })
	return on
}

func (s *fanSink) Info(level int, msg string, kv ...any) {
	kv = append(slices.Clip(s.values), kv...)
	s.f.each(s.which, func(l logr.Logger) { l.V(level).Info(msg, kv...) })
}

func (s *fanSink) Error(err error, msg string, kv ...any) {
	kv = append(slices.Clip(s.values), kv...)
	s.f.each(s.which, func(l logr.Logger) { l.Error(err, msg, kv...) })
}

func (s *fanSink) WithValues(kv ...any) logr.LogSink {
	return &fanSink{f: s.f, which: s.which, values: append(slices.Clip(s.values), kv...)}
}

func (s *fanSink) WithName(string) logr.LogSink { return s }
