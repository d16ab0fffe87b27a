package portalloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
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
	// unix socket. portalloc links no PostgreSQL client: New refuses a
	// StoreDSN with a *store.FieldError that says to call fleet.New of
	// package github.com/berth-go/berth/portalloc/fleet, which opens it.
	// Messages, logs and every fmt verb of a Config show it with its
	// password hidden.
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

// fromEnv fills in the zero fields of c from lookup's variables. The error
// joins one *store.FieldError for each variable refused, named by the
// variable.
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

// storeFieldError refuses the Config.StoreDSN s, named field (the field, or
// the variable or flag it came from): it quotes s with its password
// hidden, and says why it was refused.
func storeFieldError(field, s string, err error) *store.FieldError {
	want := `a PostgreSQL connection string ("postgres://..." or "postgresql://...", the scheme in lower case, or "host=... dbname=...") or the absolute path of the directory of its unix socket`
	var de *dsn.Error
	if errors.As(err, &de) {
		want += " (" + de.Reason + ")"
	}
	return &store.FieldError{Field: field, Value: dsn.Redact(s), Want: want}
}

// Format formats c for every verb as fmt would format its fields, with
// the password of StoreDSN hidden: no %v, %+v, %#v or %s of a Config
// shows it.
func (c Config) Format(f fmt.State, verb rune) {
	type Config configFields // the fields without this method, named as %#v shows them
	c.StoreDSN = dsn.Redact(c.StoreDSN)
	fmt.Fprintf(f, fmt.FormatString(f, verb), Config(c))
}

type configFields = Config
