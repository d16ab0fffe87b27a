package portalloc

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/store"
)

// Mode selects the backend an Allocator reserves ports with.
type Mode string

// The modes.
const (
	// ModeStateStore reserves in the state store only; a store that cannot
	// be used is an error wrapping store.ErrUnavailable.
	ModeStateStore Mode = "statestore"
	// ModeStateStoreWithFallback reserves in the state store and, while it
	// cannot be used (damaged, written by a newer berth in a way this one
	// must not write to; not merely busy or short of descriptors, memory
	// or disk, which are errors), in the MRU file, loudly. Every port still
	// takes its kernel lock, so no port a live berth holder keeps is
	// handed out. The store is tried again every 5 seconds.
	ModeStateStoreWithFallback Mode = "statestore-with-fallback"
	// ModeMRU uses the MRU file only: ports locked and bind-probed,
	// recorded nowhere a listing shows.
	ModeMRU Mode = "mru"
)

func (m Mode) valid() bool {
	return m == ModeStateStore || m == ModeStateStoreWithFallback || m == ModeMRU
}

// DefaultRange is the range of a Config that names none: 20000-32767,
// below the Linux ephemeral range (32768-60999) and the Windows and macOS
// dynamic range (49152-65535), so the system never hands one of its ports
// to an outgoing connection.
var DefaultRange = store.Range{First: 20000, Last: 32767}

// Defaults of a Config and limits of a Request.
const (
	// DefaultTimeout bounds each call when Config.Timeout is zero.
	DefaultTimeout = 30 * time.Second
	// MaxPrefer is the most ports a Request.Prefer may list.
	MaxPrefer = 1024
)

// Config configures an Allocator. New reads each field that is zero from
// its environment variable (as libpq reads PG* variables for what a
// connection string leaves out), so that programs, the berth command and
// the test helpers of a host share one store by default; a field set in
// code wins over its variable. IgnoreEnv turns the variables off. The
// variables, and the zero value of each field:
//
//	field                   variable                        zero value
//	Mode                    BERTH_MODE                      ModeStateStoreWithFallback
//	StateDir                BERTH_STATE_DIR                 $XDG_STATE_HOME/berth, else ~/.local/state/berth
//	                                                        (macOS ~/Library/Application Support/berth,
//	                                                        Windows %LocalAppData%\berth)
//	StoreDSN                BERTH_STORE                     none: the SQLite store in StateDir
//	Host                    BERTH_HOST                      the hostname
//	Range                   BERTH_PORT_RANGE (20000-32767)  DefaultRange
//	Exclude                 BERTH_PORT_EXCLUDE (22000-22100,25565)
//	AllowEphemeralOverlap   BERTH_ALLOW_EPHEMERAL_OVERLAP   false
//	AllowPrivileged         BERTH_ALLOW_PRIVILEGED          false
//	AllowBrowserRestricted  BERTH_ALLOW_BROWSER_RESTRICTED  false
//	Scope                   BERTH_SCOPE (git, dir, a name)  none
//	Timeout                 BERTH_TIMEOUT (10s)             DefaultTimeout
//	Logger                  BERTH_LOG (debug, info, warn)   discard, but for fallback warnings (standard error)
//
// New parses and validates the Config once. A value it refuses is a
// *store.FieldError naming the field ("Config.Range") or, for one read from
// the environment, the variable ("BERTH_PORT_RANGE").
type Config struct {
	// Mode selects the backend.
	Mode Mode
	// StateDir holds the state store (berth.db) and the MRU file
	// (mru.json). It is created with mode 0700, its files with 0600.
	//
	// The default is a state directory, not a cache directory: the store
	// records which live processes hold which ports, and cache cleaners
	// delete a cache by design while those processes run. Without a
	// default (no HOME, say) New refuses with an error that says to set
	// BERTH_STATE_DIR; it never falls back to the temporary directory,
	// which temp cleaners empty under long-lived holders.
	//
	// A process running as root never takes the default from another
	// user's home (sudo keeps HOME): it uses root's own instead, the home
	// directory the password database gives uid 0 plus the same path, and
	// logs that it did.
	//
	// A StateDir that cannot be created, or that (or a file of berth's in
	// it) belongs to another user, may be written by others or is a
	// symbolic link where berth creates its own file, is refused in every
	// mode with an error wrapping store.ErrUnavailable that says what to
	// fix: it is a mistake of configuration, not a fault to fall back for.
	StateDir string
	// StoreDSN names a PostgreSQL database shared by a fleet of hosts, to
	// keep the reservations in instead of the SQLite store: a connection
	// string ("postgres://user@db.example/berth", "host=/run/postgresql
	// dbname=berth") or the absolute path of the directory of the server's
	// unix socket, opened by fleet.New (package portalloc/fleet; New refuses
	// it). Messages, logs and fmt verbs show it with its password hidden.
	StoreDSN string
	// Host is this host's name in the fleet a StoreDSN is shared by. It
	// must name one machine. Without a StoreDSN it is not used.
	Host string
	// Range is where Allocate picks ports.
	Range store.Range
	// Exclude lists ports Allocate never hands out; Reserve may still
	// take them. Allocate also leaves out Linux's
	// net.ipv4.ip_local_reserved_ports (Reserve refuses those too, see
	// Request.AllowOSReserved), the OS ephemeral range unless
	// AllowEphemeralOverlap, and the ports browsers refuse unless
	// AllowBrowserRestricted.
	Exclude []store.Range
	// AllowEphemeralOverlap keeps the OS ephemeral range in Range; without
	// it the overlap is cut out of Range, with a warning logged once per
	// process.
	AllowEphemeralOverlap bool
	// AllowPrivileged lets Range reach below port 1024, where ports belong
	// to system services (and only root may bind them on most systems):
	// without it such a Range is refused. Reserve and Request.Prefer name
	// their ports, and take any.
	AllowPrivileged bool
	// AllowBrowserRestricted keeps in Range, and in Request.Prefer, the
	// ports web browsers refuse to connect to (6000, 6665-6669, 10080,
	// ...), so that a dev server is never given a port the browser will
	// not open.
	AllowBrowserRestricted bool
	// Order is the order in which Allocate tries the ports of Range when a
	// Request does not set its own; zero: OrderRandom.
	Order Order
	// Scope keeps this Allocator's labels and sticky ports apart from those
	// of other scopes, so that two checkouts of one project can use the
	// same labels side by side: "git" (the root of the current git
	// worktree), "dir" (the working directory) or a name of the caller's
	// own. New resolves it once (see ResolveScope); Config() returns what
	// it resolved to. Each Request.Label is recorded as LABEL@SCOPE, and a
	// labelled request tries the range in an order seeded by the scope and
	// the label. A scope names ports; it never changes which conflict.
	Scope string
	// Timeout bounds each call (an Allocate waiting for a locked store
	// included), New's opening of the store, and Close.
	Timeout time.Duration
	// Logger receives the Allocator's log, per-port detail at V(1). The
	// zero Logger discards it, except for the warnings that berth serves
	// from the MRU file, which then go to standard error.
	Logger logr.Logger
	// IgnoreEnv makes New read no BERTH_* variable: what this Config says,
	// and the defaults, are all.
	IgnoreEnv bool
}

// privilegedWant is what a range below 1024 wants, and how to allow it.
func privilegedWant(allow string) string {
	return "ports from 1024 up: ports below 1024 belong to system services; set " + allow + " to hand them out"
}

// env are the variables of a Config.
const (
	envMode                   = "BERTH_MODE"
	envPortRange              = "BERTH_PORT_RANGE"
	envPortExclude            = "BERTH_PORT_EXCLUDE"
	envStateDir               = "BERTH_STATE_DIR"
	envTimeout                = "BERTH_TIMEOUT"
	envAllowEphemeralOverlap  = "BERTH_ALLOW_EPHEMERAL_OVERLAP"
	envAllowBrowserRestricted = "BERTH_ALLOW_BROWSER_RESTRICTED"
	envAllowPrivileged        = "BERTH_ALLOW_PRIVILEGED"
	envLog                    = "BERTH_LOG"
	envStore                  = "BERTH_STORE"
	envHost                   = "BERTH_HOST"
	envScope                  = "BERTH_SCOPE"
)

// fromEnv fills in the zero fields of c from lookup's variables, joining
// one *store.FieldError for each variable refused.
func (c Config) fromEnv(lookup func(string) (string, bool)) (Config, error) {
	var errs []error
	get := func(name string) string {
		v, _ := lookup(name)
		return v
	}
	bad := func(name, value, want string) {
		errs = append(errs, &store.FieldError{Field: name, Value: value, Want: want})
	}
	if v := get(envMode); v != "" && c.Mode == "" {
		if c.Mode = Mode(v); !c.Mode.valid() {
			bad(envMode, v, `"statestore", "statestore-with-fallback" or "mru"`)
		}
	}
	rangeFromEnv := false
	if v := get(envPortRange); v != "" && c.Range == (store.Range{}) {
		r, err := store.ParseRange(v)
		if err != nil {
			errs = append(errs, named(envPortRange, err))
		}
		c.Range, rangeFromEnv = r, err == nil
	}
	if v := get(envPortExclude); v != "" && c.Exclude == nil {
		rs, err := store.ParseRanges(v)
		if err != nil {
			errs = append(errs, named(envPortExclude, err))
		}
		c.Exclude = rs
	}
	if c.StateDir == "" {
		c.StateDir = get(envStateDir)
	}
	if v := get(envStore); v != "" && c.StoreDSN == "" {
		if _, err := dsn.FromStore(v); err != nil {
			errs = append(errs, storeFieldError(envStore, v, err))
		}
		c.StoreDSN = v
	}
	if c.Host == "" {
		c.Host = get(envHost)
	}
	if v := get(envScope); v != "" && c.Scope == "" {
		if _, err := resolveScope(envScope, v); err != nil {
			errs = append(errs, err)
		}
		c.Scope = v
	}
	if v := get(envTimeout); v != "" && c.Timeout == 0 {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			bad(envTimeout, v, `a positive Go duration such as "10s" or "1m30s"`)
		}
		c.Timeout = d
	}
	for _, b := range []struct {
		name string
		f    *bool
	}{{envAllowEphemeralOverlap, &c.AllowEphemeralOverlap}, {envAllowBrowserRestricted, &c.AllowBrowserRestricted}, {envAllowPrivileged, &c.AllowPrivileged}} {
		if v := get(b.name); v != "" && !*b.f {
			t, err := strconv.ParseBool(v)
			if err != nil {
				bad(b.name, v, `"true" or "false"`)
			}
			*b.f = t
		}
	}
	if rangeFromEnv && c.Range.First < 1024 && !c.AllowPrivileged {
		bad(envPortRange, c.Range.String(), privilegedWant(envAllowPrivileged+"=true"))
	}
	if v := get(envLog); v != "" && c.Logger.GetSink() == nil {
		var level slog.Level
		switch v {
		case "debug":
			level = slog.LevelDebug // logr's V(1) and up
		case "info":
			level = slog.LevelInfo
		case "warn":
			level = slog.LevelWarn
		default:
			bad(envLog, v, `"debug", "info" or "warn"`)
		}
		c.Logger = TextLogger(os.Stderr, level)
	}
	return c, errors.Join(errs...)
}

// named returns a copy of err's *store.FieldError with Field set to field.
func named(field string, err error) error {
	var fe *store.FieldError
	if !errors.As(err, &fe) {
		return fmt.Errorf("%s: %w", field, err)
	}
	n := *fe
	n.Field = field
	return &n
}

// Resolve returns c as New uses it: each zero field from its environment
// variable (unless IgnoreEnv), then the defaults, all validated. A tool
// that reads or changes a store itself (statestore.Open of
// StateDir/berth.db) finds it as New would. A value it refuses is a
// *store.FieldError naming the field or the variable; the variables'
// errors are joined, one for each.
func (c Config) Resolve() (Config, error) {
	c, err := c.withDefaults()
	if err != nil {
		return Config{}, opError("", err)
	}
	return c, nil
}

// withDefaults validates c and fills in its zero values, from the
// environment first unless c.IgnoreEnv.
func (c Config) withDefaults() (Config, error) {
	if !c.IgnoreEnv {
		var err error
		if c, err = c.fromEnv(os.LookupEnv); err != nil {
			return Config{}, err
		}
	}
	invalid := func(field, value, want string) error {
		return &store.FieldError{Field: "Config." + field, Value: value, Want: want}
	}
	switch {
	case c.Mode == "":
		c.Mode = ModeStateStoreWithFallback
	case !c.Mode.valid():
		return Config{}, invalid("Mode", string(c.Mode), `"statestore", "statestore-with-fallback" or "mru"`)
	}
	if c.Range == (store.Range{}) {
		c.Range = DefaultRange
	} else if err := c.Range.Validate(); err != nil {
		return Config{}, named("Config.Range", err)
	} else if c.Range.First < 1024 && !c.AllowPrivileged {
		return Config{}, invalid("Range", c.Range.String(), privilegedWant("Config.AllowPrivileged (BERTH_ALLOW_PRIVILEGED=true)"))
	}
	for i, x := range c.Exclude {
		if err := x.Validate(); err != nil {
			return Config{}, named(fmt.Sprintf("Config.Exclude[%d]", i), err)
		}
	}
	if c.StoreDSN != "" {
		if _, err := dsn.FromStore(c.StoreDSN); err != nil {
			return Config{}, storeFieldError("Config.StoreDSN", c.StoreDSN, err)
		}
		switch c.Mode {
		case ModeMRU:
			return Config{}, invalid("Mode", string(c.Mode), `"statestore" with a Config.StoreDSN: the MRU file cannot share a fleet's reservations`)
		case ModeStateStoreWithFallback:
			c.Mode = ModeStateStore // a fleet's store never falls back
		}
	}
	scope, err := resolveScope("Config.Scope", c.Scope)
	if err != nil {
		return Config{}, err
	}
	c.Scope = scope
	switch {
	case c.Order == "":
		c.Order = OrderRandom
	case !c.Order.valid():
		return Config{}, invalid("Order", string(c.Order), `"random" or "lowest"`)
	}
	switch {
	case c.Timeout == 0:
		c.Timeout = DefaultTimeout
	case c.Timeout < 0:
		return Config{}, invalid("Timeout", c.Timeout.String(), "a positive duration, or zero for the default")
	}
	if c.StateDir == "" && c.StoreDSN == "" {
		r, err := defaultState()
		if err != nil {
			return Config{}, err
		}
		if r.rooted != "" {
			c.Logger.Info(r.rooted, "stateDir", r.dir)
		}
		c.StateDir = r.dir
	}
	if strings.ContainsRune(c.StateDir, 0) {
		return Config{}, invalid("StateDir", c.StateDir, "a directory path without a NUL byte")
	}
	return c, nil
}

// TextLogger returns a logger for Config.Logger that writes slog's text
// format to w, from level on; BERTH_LOG sets one on standard error. berth
// logs at three levels: warnings and errors (a fallback to the MRU file,
// above all), info (decisions worth knowing, such as a sticky port that had
// to move) and debug (each port reserved, each row of an exited owner
// reaped: logr's V(1) and up, all shown as DEBUG). Programs that log with
// slog already can instead hand berth their own handler:
//
//	cfg.Logger = logr.FromSlogHandler(slog.Default().Handler())
func TextLogger(w io.Writer, level slog.Level) logr.Logger {
	return logr.FromSlogHandler(debugLevels{slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})})
}

// debugLevels shows logr's verbosity levels, which logr.FromSlogHandler
// makes slog levels -1 to -4 ("DEBUG+3"), all as DEBUG.
type debugLevels struct{ slog.Handler }

func (h debugLevels) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo {
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h debugLevels) WithAttrs(attrs []slog.Attr) slog.Handler {
	return debugLevels{h.Handler.WithAttrs(attrs)}
}

func (h debugLevels) WithGroup(name string) slog.Handler {
	return debugLevels{h.Handler.WithGroup(name)}
}

// storeFieldError refuses the StoreDSN s, named field (the field, variable
// or flag it came from), quoting s with its password hidden.
func storeFieldError(field, s string, err error) *store.FieldError {
	want := `a PostgreSQL connection string ("postgres://..." or "postgresql://...", the scheme in lower case, or "host=... dbname=...") or the absolute path of the directory of its unix socket`
	var de *dsn.Error
	if errors.As(err, &de) {
		want += " (" + de.Reason + ")"
	}
	return &store.FieldError{Field: field, Value: dsn.Redact(s), Want: want}
}

// Format formats c for every verb as fmt would format its fields, with
// the password of StoreDSN hidden.
func (c Config) Format(f fmt.State, verb rune) {
	type Config configFields // the fields without this method, named as %#v shows them
	c.StoreDSN = dsn.Redact(c.StoreDSN)
	fmt.Fprintf(f, fmt.FormatString(f, verb), Config(c))
}

type configFields = Config

// storeRetryInterval is how long a store that could not be used is left
// alone before a call tries it again; tests shorten it.
var storeRetryInterval = 5 * time.Second

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

// Scopes (see Config.Scope).
const (
	scopeSep    = "@" // joins a label and its scope in the label a reservation records
	maxScopeLen = 200 // the longest scope, in bytes, once resolved
)

// modeRE matches a scope that names a mode ("git:", "env:NAME"): one berth
// does not know is refused rather than taken as a name, so that a mode a
// later berth adds never means something else to an earlier one. One
// letter and a colon is a Windows drive ("C:\src").
var modeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]+:`)

// scopeWant says what a scope may be, for error messages.
const scopeWant = `"git" (the root of the current git worktree), "dir" (the current directory), or a name of your own: printable UTF-8 of at most 200 bytes that does not start with a word of two or more letters and a colon ("git:", "env:X"), which are kept for modes`

// ResolveScope returns the scope s names for this process, as New resolves
// Config.Scope: the root of the current git worktree for "git", the
// working directory for "dir", and s itself for any other name; "" for "".
// Paths are absolute, with symbolic links resolved. A scope it refuses is a
// *store.FieldError for "scope".
func ResolveScope(s string) (string, error) { return resolveScope("scope", s) }

func resolveScope(field, s string) (string, error) {
	bad := func(w string) error { return &store.FieldError{Field: field, Value: s, Want: w} }
	switch {
	case s == "":
		return "", nil
	case s == "git", s == "dir":
		dir, err := os.Getwd()
		if real, rerr := filepath.EvalSymlinks(dir); err == nil && rerr == nil {
			dir = real
		}
		if err != nil {
			return "", bad(scopeWant + "; the working directory cannot be read: " + err.Error())
		}
		if s == "git" {
			root, ok := gitRoot(dir)
			if !ok {
				return "", bad(fmt.Sprintf("%s; %q is in no git worktree (no .git in it or any directory above it): run berth inside the checkout, or give a name", scopeWant, dir))
			}
			dir = root
		}
		return checkScopeLen(field, s, dir)
	case modeRE.MatchString(s):
		mode, _, _ := strings.Cut(s, ":")
		return "", bad(fmt.Sprintf("%s; %q is not a scope mode berth knows", scopeWant, mode+":"))
	}
	if err := store.CheckLabel(s); err != nil {
		var fe *store.FieldError
		if errors.As(err, &fe) {
			_, why, _ := strings.Cut(fe.Want, "; ") // what CheckLabel found
			return "", bad(scopeWant + "; " + why)
		}
		return "", bad(scopeWant)
	}
	return checkScopeLen(field, s, s)
}

func checkScopeLen(field, given, resolved string) (string, error) {
	if len(resolved) > maxScopeLen {
		return "", &store.FieldError{Field: field, Value: given, Want: fmt.Sprintf("%s; it resolves to %d bytes", scopeWant, len(resolved))}
	}
	return resolved, nil
}

// gitRoot returns the nearest directory at or above dir that holds .git (a
// directory, or a file in a linked worktree or submodule).
func gitRoot(dir string) (string, bool) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			return d, true
		}
		if d == filepath.Dir(d) {
			return "", false
		}
	}
}

// scopeLabel records label in scope; "" stays "".
func scopeLabel(scope, label string) string {
	if scope == "" || label == "" {
		return label
	}
	return label + scopeSep + scope
}

// scopeSeed seeds the order in which a labelled request of a scope tries
// the range, so that a label's first port in a scope is the same on every
// machine while free. A path scope counts by its last element, the
// checkout's directory name, which other machines share while the rest of
// the path differs. nil without a scope or a label: the Allocator's order.
func scopeSeed(scope, label string) *rand.Rand {
	if scope == "" || label == "" {
		return nil
	}
	name := scope
	if filepath.IsAbs(name) {
		name = filepath.Base(name)
	}
	h := fnv.New128a()
	_, _ = h.Write([]byte(name))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(label))
	sum := h.Sum(nil)
	var hi, lo uint64
	for i := range 8 {
		hi = hi<<8 | uint64(sum[i])
		lo = lo<<8 | uint64(sum[8+i])
	}
	return rand.New(rand.NewPCG(hi, lo))
}

// stateNotCache is why the default is a state directory, for people.
const stateNotCache = "state, not cache, so cache cleaners leave it"

// place is a default directory, before the root rule, and how it was found.
type place struct {
	dir  string // absolute
	how  string // for people: "$XDG_STATE_HOME/berth", ...
	vars string // the variables that chose it, for the root rule's message
	own  string // root's directory instead, relative to its home, when dir is another user's
}

// absEnv returns the variable name, an absolute path; shown names it ("$HOME").
func absEnv(name, shown string) (string, error) {
	v := os.Getenv(name)
	switch {
	case v == "":
		return "", fmt.Errorf("%s is not set", shown)
	case !filepath.IsAbs(v):
		return "", fmt.Errorf("%s %q is not an absolute path", shown, v)
	}
	return v, nil
}

// statePlace is the platform's state directory for berth (Config.StateDir).
func statePlace() (place, error) {
	switch runtime.GOOS {
	case "windows":
		base, err := absEnv("LocalAppData", "%LocalAppData%")
		if err != nil {
			return place{}, err
		}
		return place{dir: filepath.Join(base, "berth"), how: `%LocalAppData%\berth`}, nil
	case "darwin", "ios":
		home, err := absEnv("HOME", "$HOME")
		if err != nil {
			return place{}, err
		}
		rel := filepath.Join("Library", "Application Support", "berth")
		return place{dir: filepath.Join(home, rel), how: "~/Library/Application Support/berth", vars: "HOME", own: rel}, nil
	}
	rel := filepath.Join(".local", "state", "berth")
	x := os.Getenv("XDG_STATE_HOME")
	if x != "" && filepath.IsAbs(x) {
		return place{dir: filepath.Join(x, "berth"), how: "$XDG_STATE_HOME/berth", vars: "XDG_STATE_HOME", own: rel}, nil
	}
	home, err := absEnv("HOME", "$HOME")
	if err != nil {
		return place{}, err
	}
	how := "$XDG_STATE_HOME unset, so ~/.local/state/berth"
	if x != "" {
		// The XDG base directory specification: "If an implementation
		// encounters a relative path in any of these variables it should
		// consider the path invalid and ignore it."
		how = fmt.Sprintf("$XDG_STATE_HOME %q is relative, which the XDG base directory spec says to ignore, so ~/.local/state/berth", x)
	}
	return place{dir: filepath.Join(home, rel), how: how, vars: "HOME", own: rel}, nil
}

// resolved is a default directory with the root rule applied.
type resolved struct {
	dir    string
	reason string // for people: how it was chosen, without stateNotCache
	rooted string // non-empty when root uses its own directory: why, to log
}

// forRoot applies the root rule of Config.StateDir to p, refusing with
// ErrUnsafe when root cannot have its own directory.
func forRoot(p place) (resolved, error) {
	r := resolved{dir: p.dir, reason: "the default: " + p.how}
	if geteuid() != 0 || p.own == "" {
		return r, nil
	}
	uid, foreign := foreignOwner(p.dir)
	if !foreign {
		return r, nil
	}
	refuse := func(reason string) (resolved, error) {
		return resolved{}, fmt.Errorf("%w: running as root, the default state directory %s is in a directory of uid %d (%s is another user's, as sudo keeps it), and berth never creates root's files there; %s: set %s or Config.StateDir to a directory of root's",
			store.ErrUnsafe, p.dir, uid, p.vars, reason, envStateDir)
	}
	root, err := lookupRoot()
	if err != nil || root.HomeDir == "" || !filepath.IsAbs(root.HomeDir) {
		return refuse(fmt.Sprintf("root's home directory cannot be read from the password database (%v)", err))
	}
	own := filepath.Join(root.HomeDir, p.own)
	if ouid, foreign := foreignOwner(own); foreign {
		return refuse(fmt.Sprintf("root's own %s is in a directory of uid %d too", own, ouid))
	}
	return resolved{
		dir:    own,
		reason: fmt.Sprintf("the default for root: %s is another user's (uid %d; sudo keeps it), so root's own ~root/%s", p.vars, uid, filepath.ToSlash(p.own)),
		rooted: fmt.Sprintf("running as root with another user's %s (%s, uid %d; sudo keeps it); using root's own state directory instead", p.vars, p.dir, uid),
	}, nil
}

// defaultState is defaultStateDir with how it was chosen.
func defaultState() (resolved, error) {
	p, err := statePlace()
	if err != nil {
		return resolved{}, fmt.Errorf("%w: no default state directory (%w); set %s or Config.StateDir", store.ErrUnavailable, err, envStateDir)
	}
	return forRoot(p)
}

// Inject the process's identity and the password database, for tests.
var (
	geteuid    = os.Geteuid
	lookupRoot = func() (*user.User, error) { return user.LookupId("0") }
)

// DefaultStateDir returns the state directory of a Config that names none
// (and BERTH_STATE_DIR unset), and why it is that one, for people: see
// Config.StateDir. Without one (no HOME, say) it returns an error wrapping
// store.ErrUnavailable that says what to set.
func DefaultStateDir() (dir, reason string, err error) {
	r, err := defaultState()
	if err != nil {
		return "", "", opError("", err)
	}
	return r.dir, r.reason + "; " + stateNotCache, nil
}
