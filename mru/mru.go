// Package mru is berth's fallback allocator: a bind-probed port that was not
// handed out recently, as recorded in a small file.
//
// It serves when the SQLite state store cannot. It gives weaker guarantees:
// a port it hands out is reserved by nobody, only remembered for Window so
// that no berth process hands it out again meanwhile; between the probe and
// the consumer's own bind another program can still take it.
//
// # File format
//
// The file is JSON, rewritten whole and atomically (write to a temporary
// file, then rename) while holding an flock of the sidecar file <path>.lock:
//
//	{"format":"berth-mru","version":1,"entries":[
//	  {"protocol":"tcp","port":20417,"at":1763798400123}
//	]}
//
// at is when the port was handed out, unix milliseconds. Entries older than
// Window are dropped on every write, and at most MaxEntries of the newest are
// kept. A file that cannot be read as this format (damaged, foreign, a newer
// version) is logged, renamed to <path>.bad-<unix nanoseconds> so nothing is
// lost, and started afresh. When the file cannot be locked or written (a
// read-only or full state directory), the allocator logs that once and goes
// on handing out bind-probed ports without recording them.
package mru

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/gofrs/flock"
)

const (
	formatName = "berth-mru"
	// Version is the file format version this package writes.
	Version = 1
)

// ErrExhausted is returned when no candidate port is free and not recent.
var ErrExhausted = errors.New("mru: no free port that was not handed out recently")

// Options tune a File. Every zero value is a working default.
type Options struct {
	// Window is how long a handed-out port is skipped; zero: 10 minutes.
	Window time.Duration
	// MaxEntries bounds the file; zero: 512.
	MaxEntries int
	// Logger receives warnings about damaged files; zero: discard.
	Logger logr.Logger
	// Now is the clock; zero: time.Now.
	Now func() time.Time
}

// File is an MRU file at a path. It is safe for concurrent use: every call
// locks the file for its whole read-choose-write cycle.
type File struct {
	path string
	opts Options

	degraded sync.Once // logs the first failure to lock or write the file
}

// New returns the MRU file at path. It does no I/O: the file and its
// directory are created on the first Allocate.
func New(path string, opts Options) *File {
	if opts.Window <= 0 {
		opts.Window = 10 * time.Minute
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = 512
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &File{path: path, opts: opts}
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Entry is one handed-out port.
type Entry struct {
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port"`
	At       int64  `json:"at"` // unix milliseconds
}

type fileData struct {
	Format  string  `json:"format"`
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// Request says what to allocate.
type Request struct {
	Protocol string // "tcp" or "udp"
	Addr     netip.Addr
	// Next yields candidate ports; nil lets the OS choose from its
	// ephemeral range by binding port 0.
	Next func() (uint16, bool)
	// Probe reports whether a candidate can be bound; it is required with
	// Next.
	Probe func(port uint16) (bool, error)
}

// maxOSTries bounds the port-0 attempts when the OS keeps choosing ports
// that were handed out recently.
const maxOSTries = 64

// Allocate picks a port that is bindable now and was not handed out within
// Window, records it, and returns it.
func (f *File) Allocate(ctx context.Context, req Request) (uint16, error) {
	if req.Protocol != "tcp" && req.Protocol != "udp" {
		return 0, fmt.Errorf("mru: protocol %q: want tcp or udp", req.Protocol)
	}
	if req.Next != nil && req.Probe == nil {
		return 0, errors.New("mru: a candidate iterator needs a probe")
	}
	var port uint16
	err := f.update(ctx, func(entries []Entry, now time.Time) ([]Entry, error) {
		recent := make(map[uint16]bool, len(entries))
		for _, e := range entries {
			if e.Protocol == req.Protocol {
				recent[e.Port] = true
			}
		}
		var err error
		if req.Next != nil {
			port, err = pickFrom(ctx, req, recent)
		} else {
			port, err = pickOS(ctx, req, recent)
		}
		if err != nil {
			return nil, err
		}
		return append(entries, Entry{Protocol: req.Protocol, Port: port, At: now.UnixMilli()}), nil
	})
	return port, err
}

// Record remembers a port handed out by other means (a specific port a
// caller asked for), so Allocate skips it for Window.
func (f *File) Record(ctx context.Context, protocol string, port uint16) error {
	return f.update(ctx, func(entries []Entry, now time.Time) ([]Entry, error) {
		return append(entries, Entry{Protocol: protocol, Port: port, At: now.UnixMilli()}), nil
	})
}

// Entries returns the unexpired entries, oldest first.
func (f *File) Entries(ctx context.Context) ([]Entry, error) {
	var out []Entry
	err := f.update(ctx, func(entries []Entry, _ time.Time) ([]Entry, error) {
		out = append(out, entries...)
		return entries, nil
	})
	return out, err
}

func pickFrom(ctx context.Context, req Request, recent map[uint16]bool) (uint16, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		p, ok := req.Next()
		if !ok {
			return 0, ErrExhausted
		}
		if recent[p] {
			continue
		}
		free, err := req.Probe(p)
		if err != nil {
			return 0, err
		}
		if free {
			return p, nil
		}
	}
}

func pickOS(ctx context.Context, req Request, recent map[uint16]bool) (uint16, error) {
	for range maxOSTries {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		p, err := osPort(req.Protocol, req.Addr)
		if err != nil {
			return 0, err
		}
		if !recent[p] {
			return p, nil
		}
	}
	return 0, ErrExhausted
}

// osPort binds port 0 and returns the port the OS chose.
func osPort(protocol string, addr netip.Addr) (uint16, error) {
	hp := netip.AddrPortFrom(addr, 0).String()
	if protocol == "tcp" {
		l, err := net.Listen("tcp", hp)
		if err != nil {
			return 0, fmt.Errorf("mru: %w", err)
		}
		defer func() { _ = l.Close() }()
		return netip.MustParseAddrPort(l.Addr().String()).Port(), nil
	}
	c, err := net.ListenPacket("udp", hp)
	if err != nil {
		return 0, fmt.Errorf("mru: %w", err)
	}
	defer func() { _ = c.Close() }()
	return netip.MustParseAddrPort(c.LocalAddr().String()).Port(), nil
}

// update runs fn on the unexpired entries with the file locked, and writes
// back what it returns.
func (f *File) update(ctx context.Context, fn func([]Entry, time.Time) ([]Entry, error)) error {
	if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
		f.degrade(err)
	}
	lock := flock.New(f.path+".lock", flock.SetPermissions(0o600))
	defer func() { _ = lock.Close() }()
	ok, err := lock.TryLockContext(ctx, time.Millisecond)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		// The MRU file is the last resort: a state directory that cannot
		// be written (read-only, full) must not stop bind-probed ports
		// from being handed out. Only the memory of recent ports is lost.
		f.degrade(fmt.Errorf("lock %s: %w", lock.Path(), err))
	case !ok:
		return ctx.Err()
	default:
		defer func() { _ = lock.Unlock() }()
	}

	now := f.opts.Now()
	entries := f.read(now)
	out, err := fn(entries, now)
	if err != nil {
		return err
	}
	if len(out) > f.opts.MaxEntries {
		out = out[len(out)-f.opts.MaxEntries:]
	}
	b, err := json.Marshal(fileData{Format: formatName, Version: Version, Entries: out})
	if err != nil {
		return fmt.Errorf("mru: %w", err)
	}
	if err := writeAtomic(f.path, b); err != nil {
		f.degrade(fmt.Errorf("write %s: %w", f.path, err))
	}
	return nil
}

// degrade logs, once per File, that recent ports are not being recorded.
func (f *File) degrade(err error) {
	f.degraded.Do(func() {
		f.opts.Logger.Error(err, "cannot record handed-out ports in the MRU file; ports are still bind-probed, but may be handed out again within the window")
	})
}

// read returns the file's unexpired entries. A missing file is empty; a
// damaged or foreign one is set aside and counts as empty.
func (f *File) read(now time.Time) []Entry {
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.setAside(err)
		return nil
	}
	entries, err := Parse(b)
	if err != nil {
		f.setAside(err)
		return nil
	}
	cutoff := now.Add(-f.opts.Window).UnixMilli()
	live := entries[:0]
	for _, e := range entries {
		if e.At > cutoff && e.At <= now.Add(f.opts.Window).UnixMilli() {
			live = append(live, e)
		}
	}
	return live
}

func (f *File) setAside(cause error) {
	aside := f.path + ".bad-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := os.Rename(f.path, aside); err != nil {
		f.opts.Logger.Error(err, "MRU file is unreadable and could not be set aside; it will be overwritten", "path", f.path, "cause", cause.Error())
		return
	}
	f.opts.Logger.Info("MRU file was unreadable; set it aside and started afresh", "path", f.path, "movedTo", aside, "cause", cause.Error())
}

// Parse parses the bytes of an MRU file. It accepts exactly the documented
// format and version, with valid protocols and ports.
func Parse(b []byte) ([]Entry, error) {
	var d fileData
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("mru: not an MRU file: %w", err)
	}
	if d.Format != formatName {
		return nil, fmt.Errorf("mru: format %q: want %q", d.Format, formatName)
	}
	if d.Version != Version {
		return nil, fmt.Errorf("mru: version %d: this berth reads version %d", d.Version, Version)
	}
	for _, e := range d.Entries {
		if e.Protocol != "tcp" && e.Protocol != "udp" {
			return nil, fmt.Errorf("mru: entry protocol %q: want tcp or udp", e.Protocol)
		}
		if e.Port == 0 {
			return nil, errors.New("mru: entry port 0: want 1-65535")
		}
	}
	return d.Entries, nil
}
