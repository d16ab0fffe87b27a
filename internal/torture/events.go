package torture

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Event is one line of a process's append-only log.
type Event struct {
	T    int64  `json:"t"`    // wall clock, unix nanoseconds
	Kind string `json:"kind"` // see the kind constants
	// Proc names the process the event is about, uniquely within a run:
	// "w7" is the seventh worker, "w7.3" its third child. Pids are not
	// enough: a long run starts more processes than the kernel has pids.
	Proc  string `json:"proc"`
	PID   int    `json:"pid"`
	Proto string `json:"proto,omitempty"`
	Addr  string `json:"addr,omitempty"`
	Port  uint16 `json:"port,omitempty"`
	// Static marks a grant from Reserve rather than Allocate.
	Static bool `json:"static,omitempty"`
	// Handoff marks a grant that is meant for a child, not bound by the
	// worker itself.
	Handoff bool   `json:"handoff,omitempty"`
	Child   string `json:"child,omitempty"` // the Proc a grant was handed to
	Err     string `json:"err,omitempty"`
	DurNS   int64  `json:"dur_ns,omitempty"`
	Reaped  int64  `json:"reaped,omitempty"`
}

// Event kinds.
const (
	KindGrant     = "grant"      // a port was handed to the worker
	KindBind      = "bind"       // the worker bound a grant (Err set on failure)
	KindRelease   = "release"    // the worker closed its socket and releases
	KindTransfer  = "transfer"   // the worker handed a grant to Child
	KindChildBind = "child-bind" // a child bound its port (Err set on failure)
	KindChildExit = "child-exit" // a child closed its socket and exits
	KindExhausted = "exhausted"  // Allocate found the range full
	KindError     = "error"      // an unexpected error
	KindKill      = "kill"       // the supervisor is about to SIGKILL Proc
	KindExit      = "exit"       // a worker released everything and exits
)

// eventLog appends events to a file, one write per event, so a SIGKILL
// loses at most the event being written.
type eventLog struct {
	mu   sync.Mutex // guards f
	f    *os.File
	proc string
	pid  int
}

// openLog opens the log of process proc in dir/logs.
func openLog(dir, proc string) (*eventLog, error) {
	f, err := os.OpenFile(filepath.Join(dir, "logs", proc+".jsonl"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("torture: event log: %w", err)
	}
	return &eventLog{f: f, proc: proc, pid: os.Getpid()}, nil
}

func (l *eventLog) add(e Event) {
	if e.T == 0 {
		e.T = time.Now().UnixNano()
	}
	if e.Proc == "" {
		e.Proc, e.PID = l.proc, l.pid
	}
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(b, '\n'))
}

func (l *eventLog) close() error { return l.f.Close() }
