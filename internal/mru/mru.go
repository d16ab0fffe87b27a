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
// The file is JSON Lines: a header line, then one line per handed-out port,
// appended while holding an flock of the sidecar file <path>.lock:
//
//	{"format":"berth-mru","version":2}
//	{"protocol":"tcp","port":20417,"at":1763798400123}
//
// at is unix milliseconds. An append is one write, unsynced: a crash can
// tear only the last line, which readers ignore and the next writer cuts
// off. When most lines have expired the file is rewritten atomically
// (temporary file, sync, rename). Each File reads only what others
// appended since its last read, so a call costs the same with ten lines or
// ten thousand.
//
// A version 1 file (one JSON object) is read and rewritten as version 2.
// One that cannot be read (damaged, foreign, newer) or is over MaxFileSize
// is logged, renamed to <path>.bad-<unix nanoseconds> and started afresh.
// A path that is not a regular file, a symbolic link, or one another user
// owns or others may write is refused (ErrUnsafe) unopened. A file that
// cannot be locked or written is logged once, and ports go on being
// probed unrecorded; a shortage of descriptors or memory, or an
// interrupted call, fails the call (ErrTransient).
package mru

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/store"
)

const (
	formatName = "berth-mru"
	// Version is the file format version this package writes.
	Version = 2
	// MaxFileSize is the largest MRU file read; a larger one is set aside.
	MaxFileSize = 4 << 20
)

var header = []byte(`{"format":"berth-mru","version":2}` + "\n")

// ErrExhausted is returned when no candidate port is free and not recent.
var ErrExhausted = errors.New("no free port that was not handed out recently")

// ErrUnsafe is wrapped by the error for an MRU path or state directory that
// berth refuses to open: not a regular file, a symbolic link, or owned or
// writable by another user.
var ErrUnsafe = safefs.ErrUnsafe

// ErrTransient is wrapped by the error of a call that failed for want of
// file descriptors or memory, or was interrupted: try again once the
// shortage has passed. It is the sentinel store.ErrTransient is.
var ErrTransient = transient.ErrTransient

// Options tune a File. Every zero value is a working default.
type Options struct {
	// Window is how long a handed-out port is skipped; zero: 10 minutes.
	Window time.Duration
	// MaxEntries bounds the ports remembered; zero: 512. The newest are
	// kept; between trims up to a quarter more are still skipped.
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

	// sem is a one-slot semaphore taken with a context. It guards lock and
	// the view of the file.
	sem  chan struct{}
	lock *filelock.File // opened on first use; nil while it cannot be
	view view

	degraded sync.Once // logs the first failure to lock or write the file
}

// view is what this File has read of the file: the entries of the lines up
// to end, in the file identified by id.
type view struct {
	valid   bool
	id      os.FileInfo // the file read, to notice a rewrite by another process
	end     int64       // offset after the last whole line read
	entries []Entry     // oldest first; expired ones are dropped now and then
	recent  map[key]int64
	lines   int // entry lines in the file, live or not
}

type key struct {
	protocol string
	port     uint16
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
	return &File{path: path, opts: opts, sem: make(chan struct{}, 1)}
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Close closes the lock file a File keeps open between calls. A File is
// usable again after Close; it reopens what it needs.
func (f *File) Close() error {
	f.sem <- struct{}{}
	defer func() { <-f.sem }()
	f.view = view{}
	if f.lock == nil {
		return nil
	}
	err := f.lock.Close()
	f.lock = nil
	return err
}

// Entry is one handed-out port.
type Entry struct {
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port"`
	At       int64  `json:"at"` // unix milliseconds
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
// Window, records it, and returns it. A request it refuses (a protocol
// other than "tcp" or "udp", a Next without a Probe) is a
// *store.FieldError, for which errors.Is(err, store.ErrInvalid) holds.
func (f *File) Allocate(ctx context.Context, req Request) (uint16, error) {
	if req.Protocol != "tcp" && req.Protocol != "udp" {
		return 0, &store.FieldError{Field: "Request.Protocol", Value: req.Protocol, Want: `"tcp" or "udp"`}
	}
	if req.Next != nil && req.Probe == nil {
		return 0, &store.FieldError{Field: "Request.Probe", Value: "nil", Want: "a probe, which a Request with a candidate iterator (Next) needs"}
	}
	var port uint16
	err := f.update(ctx, func(recent func(string, uint16) bool, now time.Time) ([]Entry, error) {
		var err error
		if req.Next != nil {
			port, err = pickFrom(ctx, req, recent)
		} else {
			port, err = pickOS(ctx, req, recent)
		}
		if err != nil {
			return nil, err
		}
		return []Entry{{Protocol: req.Protocol, Port: port, At: now.UnixMilli()}}, nil
	})
	return port, err
}

// Record remembers a port handed out by other means (a specific port a
// caller asked for), so Allocate skips it for Window. A protocol other than
// "tcp" or "udp" is refused with a *store.FieldError.
func (f *File) Record(ctx context.Context, protocol string, port uint16) error {
	if protocol != "tcp" && protocol != "udp" {
		return &store.FieldError{Field: "protocol", Value: protocol, Want: `"tcp" or "udp"`}
	}
	return f.update(ctx, func(_ func(string, uint16) bool, now time.Time) ([]Entry, error) {
		return []Entry{{Protocol: protocol, Port: port, At: now.UnixMilli()}}, nil
	})
}

// Entries returns the unexpired entries, oldest first.
func (f *File) Entries(ctx context.Context) ([]Entry, error) {
	var out []Entry
	err := f.update(ctx, func(_ func(string, uint16) bool, now time.Time) ([]Entry, error) {
		out = f.live(now)
		out = out[max(0, len(out)-f.opts.MaxEntries):]
		return nil, nil
	})
	return out, err
}

func pickFrom(ctx context.Context, req Request, recent func(string, uint16) bool) (uint16, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		p, ok := req.Next()
		if !ok {
			return 0, ErrExhausted
		}
		if recent(req.Protocol, p) {
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

func pickOS(ctx context.Context, req Request, recent func(string, uint16) bool) (uint16, error) {
	for range maxOSTries {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		p, err := osPort(req.Protocol, req.Addr)
		if err != nil {
			return 0, err
		}
		if !recent(req.Protocol, p) {
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
			return 0, fmt.Errorf("MRU file: %w", err)
		}
		defer func() { _ = l.Close() }()
		return netip.MustParseAddrPort(l.Addr().String()).Port(), nil
	}
	c, err := net.ListenPacket("udp", hp)
	if err != nil {
		return 0, fmt.Errorf("MRU file: %w", err)
	}
	defer func() { _ = c.Close() }()
	return netip.MustParseAddrPort(c.LocalAddr().String()).Port(), nil
}

// update brings the view up to date with the file locked, runs fn, and
// appends the entries it returns. Every wait ends with ctx.
func (f *File) update(ctx context.Context, fn func(recent func(string, uint16) bool, now time.Time) ([]Entry, error)) error {
	select {
	case f.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-f.sem }()
	if err := safefs.PrepareDir(filepath.Dir(f.path)); err != nil {
		if errors.Is(err, safefs.ErrUnsafe) {
			return fmt.Errorf("MRU file: %w", err)
		}
		if err := f.degrade(err); err != nil {
			return err
		}
	}
	for _, p := range []string{f.path, f.path + ".lock"} {
		if err := safefs.CheckFile(p); err != nil {
			return fmt.Errorf("MRU file: %w", err)
		}
	}
	unlock, err := f.lockFile(ctx)
	if err != nil {
		return err
	}
	defer unlock()

	now := f.opts.Now()
	if err := f.refresh(now); err != nil {
		return err
	}
	recent := func(protocol string, port uint16) bool {
		at, ok := f.view.recent[key{protocol, port}]
		return ok && f.fresh(at, now)
	}
	add, err := fn(recent, now)
	if err != nil {
		return err
	}
	if len(add) > 0 {
		return f.append(add, now)
	}
	return nil
}

// lockFile takes the sidecar flock, polling so that ctx is honoured. A lock
// file that cannot be opened or locked (a read-only or full state
// directory) degrades the File instead of failing it.
func (f *File) lockFile(ctx context.Context) (func(), error) {
	var err error
	if f.lock == nil {
		if f.lock, err = filelock.Open(f.path + ".lock"); errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("MRU file: %w", &safefs.UnsafeError{Path: f.path + ".lock", Why: "is a symbolic link where berth keeps its own file", Fix: "remove the link"})
		}
	}
	for wait := 50 * time.Microsecond; err == nil; wait = min(2*wait, 5*time.Millisecond) {
		var ok bool
		if ok, err = f.lock.TryLock(); ok {
			return func() { _ = f.lock.Unlock() }, nil
		} else if err != nil {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return func() {}, f.degrade(err)
}

// fresh reports whether an entry handed out at at is still within Window.
func (f *File) fresh(at int64, now time.Time) bool {
	return at > now.Add(-f.opts.Window).UnixMilli() && at <= now.Add(f.opts.Window).UnixMilli()
}

// live returns the view's unexpired entries, oldest first.
func (f *File) live(now time.Time) []Entry {
	var out []Entry
	for _, e := range f.view.entries {
		if f.fresh(e.At, now) {
			out = append(out, e)
		}
	}
	return out
}

// refresh reads what other processes appended since the last call, or the
// whole file when it was replaced.
func (f *File) refresh(now time.Time) error {
	file, err := safefs.OpenFile(f.path, os.O_RDONLY, 0)
	switch {
	case errors.Is(err, safefs.ErrUnsafe):
		return fmt.Errorf("MRU file: %w", err)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		if err := f.degrade(err); err != nil {
			return err
		}
		fallthrough
	case err != nil:
		f.view = view{valid: true}
		return nil
	}
	defer func() { _ = file.Close() }()
	fi, err := file.Stat()
	if err != nil {
		return fmt.Errorf("MRU file: %w", err)
	}
	if fi.Size() > MaxFileSize {
		f.setAside(fmt.Errorf("file is %d bytes, more than the %d an MRU file may have", fi.Size(), MaxFileSize))
		f.view = view{valid: true}
		return nil
	}
	v := &f.view
	if !v.valid || v.id == nil || !os.SameFile(v.id, fi) || fi.Size() < v.end {
		*v = view{id: fi}
	}
	if fi.Size() == v.end && v.valid {
		return nil
	}
	buf := make([]byte, fi.Size()-v.end)
	if _, err := file.ReadAt(buf, v.end); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("MRU file: read %s: %w", f.path, err)
	}
	start := v.end
	if start == 0 {
		entries, n, err := parseStart(buf)
		if err != nil {
			f.setAside(err)
			*v = view{valid: true}
			return nil
		}
		if n < 0 {
			// Version 1: one JSON object; rewrite it as version 2.
			v.valid = true
			f.add(entries)
			return f.rewrite(now)
		}
		buf, start = buf[n:], int64(n)
	}
	entries, n, bad := parseLines(buf)
	if bad > 0 {
		f.opts.Logger.Info("MRU file has lines that are not entries; skipped them", "path", f.path, "lines", bad)
	}
	f.add(entries)
	v.end, v.id, v.valid = start+int64(n), fi, true
	return nil
}

// add puts entries into the view, dropping the oldest beyond MaxEntries.
func (f *File) add(entries []Entry) {
	v := &f.view
	if v.recent == nil {
		v.recent = map[key]int64{}
	}
	for _, e := range entries {
		v.entries = append(v.entries, e)
		v.lines++
		if at, ok := v.recent[key{e.Protocol, e.Port}]; !ok || e.At > at {
			v.recent[key{e.Protocol, e.Port}] = e.At
		}
	}
	// Trim in batches, so that a full view costs no copy per entry added.
	if len(v.entries) > f.opts.MaxEntries+f.opts.MaxEntries/4 {
		over := len(v.entries) - f.opts.MaxEntries
		for _, e := range v.entries[:over] {
			if v.recent[key{e.Protocol, e.Port}] == e.At {
				delete(v.recent, key{e.Protocol, e.Port})
			}
		}
		v.entries = append(v.entries[:0:0], v.entries[over:]...)
	}
}

// append writes entries to the end of the file, after cutting off a line a
// crash may have torn, and rewrites the file when most of it has expired.
// It fails only for a passing shortage (see degrade).
func (f *File) append(entries []Entry, now time.Time) error {
	v := &f.view
	if v.end == 0 || v.id == nil {
		f.add(entries)
		return f.rewrite(now)
	}
	file, err := safefs.OpenFile(f.path, os.O_WRONLY, 0)
	if err != nil {
		if err := f.degrade(fmt.Errorf("write %s: %w", f.path, err)); err != nil {
			return err
		}
		f.add(entries)
		return nil
	}
	defer func() { _ = file.Close() }()
	if fi, err := file.Stat(); err != nil || !os.SameFile(fi, v.id) {
		f.add(entries)
		f.view.valid = false // replaced under us: read it whole next time
		return nil
	} else if fi.Size() != v.end {
		_ = file.Truncate(v.end) // a torn last line
	}
	b := appendLines(nil, entries)
	if _, err := file.WriteAt(b, v.end); err != nil {
		_ = file.Truncate(v.end)
		if err := f.degrade(fmt.Errorf("write %s: %w", f.path, err)); err != nil {
			return err
		}
		f.add(entries)
		return nil
	}
	v.end += int64(len(b))
	f.add(entries)
	// Now and then, not on every append (counting live entries reads them
	// all), rewrite a file most of whose lines have expired or been
	// trimmed.
	if every := max(256, f.opts.MaxEntries); v.lines%every == 0 && len(f.live(now)) < v.lines/4 {
		return f.rewrite(now)
	}
	return nil
}

// rewrite replaces the file with the view's live entries, atomically. It
// fails only for a passing shortage (see degrade).
func (f *File) rewrite(now time.Time) error {
	live := f.live(now)
	b := appendLines(header, live)
	if err := writeAtomic(f.path, b); err != nil {
		return f.degrade(fmt.Errorf("write %s: %w", f.path, err))
	}
	fi, err := os.Lstat(f.path)
	if err != nil {
		f.view.valid = false
		return nil
	}
	f.view = view{valid: true, id: fi, end: int64(len(b))}
	f.add(live)
	f.view.lines = len(live)
	return nil
}

// writeAtomic replaces the file at path with b (mode 0600), so that readers
// see the old file or the new one, never a part: a temporary file in the
// same directory, synced, then renamed over path (on Windows MoveFileEx
// with MOVEFILE_REPLACE_EXISTING, which renameio does not support).
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// appendLines appends entries to b as lines of the file.
func appendLines(b []byte, entries []Entry) []byte {
	b = slices.Clip(b)
	for _, e := range entries {
		line, _ := json.Marshal(e)
		b = append(append(b, line...), '\n')
	}
	return b
}

// degrade logs, once per File, that recent ports are not being recorded,
// and returns nil: a read-only or full state directory. A passing shortage
// of descriptors or memory, or an interrupted call, is no such thing: the
// process that cannot open the MRU file cannot be trusted to probe and
// hand out a port either, so degrade returns it as an error wrapping
// ErrTransient, and the call fails.
func (f *File) degrade(err error) error {
	if transient.Is(err) && !transient.IsDisk(err) {
		return fmt.Errorf("MRU file: %w", transient.Wrap(err))
	}
	f.degraded.Do(func() {
		f.opts.Logger.Error(err, "cannot record handed-out ports in the MRU file; ports are still bind-probed, but may be handed out again within the window")
	})
	return nil
}

func (f *File) setAside(cause error) {
	aside := f.path + ".bad-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := os.Rename(f.path, aside); err != nil {
		f.opts.Logger.Error(err, "MRU file is unreadable and could not be set aside; it will be overwritten", "path", f.path, "cause", cause.Error())
		return
	}
	f.opts.Logger.Info("MRU file was unreadable; set it aside and started afresh", "path", f.path, "movedTo", aside, "cause", cause.Error())
}

type v1File struct {
	Format  string  `json:"format"`
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// parseStart reads the start of a file: a version 2 header line, whose
// length it returns with no entries, or a whole version 1 file, whose
// entries it returns with length -1.
func parseStart(b []byte) ([]Entry, int, error) {
	line, _, complete := bytes.Cut(b, []byte("\n"))
	var h v1File
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, 0, fmt.Errorf("not an MRU file: %w", err)
	}
	if h.Format != formatName {
		return nil, 0, fmt.Errorf("MRU file: format %q: want %q", h.Format, formatName)
	}
	switch {
	case h.Version == 1:
		if err := json.Unmarshal(b, &h); err != nil {
			return nil, 0, fmt.Errorf("not an MRU file: %w", err)
		}
		for _, e := range h.Entries {
			if err := e.check(); err != nil {
				return nil, 0, err
			}
		}
		return h.Entries, -1, nil
	case h.Version != Version:
		return nil, 0, fmt.Errorf("MRU file: version %d: this berth reads versions 1 and %d", h.Version, Version)
	case !complete || h.Entries != nil:
		return nil, 0, errors.New("MRU file: damaged header line")
	}
	return nil, len(line) + 1, nil
}

// parseLines parses entry lines up to the last newline, and returns the
// entries, how many bytes they took, and how many lines were not entries.
func parseLines(b []byte) ([]Entry, int, int) {
	var (
		out []Entry
		n   int
		bad int
	)
	for {
		line, rest, ok := bytes.Cut(b, []byte("\n"))
		if !ok {
			return out, n, bad // a torn last line, or nothing
		}
		n += len(line) + 1
		b = rest
		var e Entry
		if err := json.Unmarshal(line, &e); err != nil || e.check() != nil {
			bad++
			continue
		}
		out = append(out, e)
	}
}

func (e Entry) check() error {
	if e.Protocol != "tcp" && e.Protocol != "udp" {
		return fmt.Errorf("MRU file: entry protocol %q: want tcp or udp", e.Protocol)
	}
	if e.Port == 0 {
		return errors.New("MRU file: entry port 0: want 1-65535")
	}
	return nil
}
