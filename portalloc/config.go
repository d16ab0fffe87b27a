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
	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc/internal/scopes"
	"github.com/berth-go/berth/store"
)

// Mode selects the backend an Allocator reserves ports with.
type Mode string

// The modes.
const (
	// ModeStateStore reserves in the SQLite state store only; a store
	// failure is an error wrapping ErrStoreUnavailable.
	ModeStateStore Mode = "statestore"
	// ModeStateStoreWithFallback reserves in the state store and, when it
	// cannot be used (not merely busy, nor short of descriptors, memory or
	// disk space: those are errors), falls back to the MRU allocator,
	// logging the switch. The MRU allocator skips the ports the store
	// holds, and when it cannot read the store either, it hands out none:
	// the call fails with an error wrapping ErrStoreUnavailable. The store
	// is tried again every 5 seconds. See the package
	// documentation.
	ModeStateStoreWithFallback Mode = "statestore-with-fallback"
	// ModeMRU uses the legacy MRU-file allocator only. It skips the ports
	// the state store holds while the store can be read, and otherwise
	// serves blind, with a warning, counted in Stats.Blind: the one mode
	// that may hand out a port another process has reserved, for a caller
	// that chose it.
	ModeMRU Mode = "mru"
)

func (m Mode) valid() bool {
	return m == ModeStateStore || m == ModeStateStoreWithFallback || m == ModeMRU
}

// Protocol is the transport a port is allocated for: TCP or UDP. It is
// the type package store declares, under this name.
type Protocol = store.Protocol

// The protocols.
const (
	TCP = store.TCP
	UDP = store.UDP
)

// Limits and defaults of a Config and a Request.
const (
	// DefaultTimeout bounds one Allocate or Reserve when Config.Timeout is
	// zero.
	DefaultTimeout = 30 * time.Second
	// MaxPrefer is the most ports a Request.Prefer may list.
	MaxPrefer = 1024
)

// Config configures an Allocator. The zero value of every field is a working
// default; New parses and validates it once.
type Config struct {
	// Mode selects the backend; zero: ModeStateStoreWithFallback.
	Mode Mode
	// StateDir holds the state store (berth.db) and the MRU file
	// (mru.json); zero: statedir.Default. It is created with mode 0700, its
	// files with 0600.
	//
	// The default is a state directory, not a cache directory: the store
	// records which live processes hold which ports, and cache cleaners,
	// rm -rf ~/.cache, disk-space tools and CI cache restores delete a
	// cache by design while those processes run, after which their ports
	// would be granted again. On Linux and the other Unix systems but
	// macOS it is $XDG_STATE_HOME/berth when XDG_STATE_HOME is an absolute
	// path (the XDG base directory specification says to ignore a
	// relative one), else $HOME/.local/state/berth. On macOS it is
	// ~/Library/Application Support/berth, where applications keep data
	// they make for themselves; macOS may purge ~/Library/Caches when the
	// disk runs short. On Windows it is %LocalAppData%\berth: local state
	// (os.UserConfigDir is the roaming profile, which follows the user to
	// other machines where these pids mean nothing). Without a default (no
	// HOME, say) New refuses with an error that says to set
	// BERTH_STATE_DIR: it never falls back to the temporary directory,
	// which temp cleaners empty under long-lived holders. Package porttest
	// does, for the short life of a test run.
	//
	// Earlier berths kept the store in os.UserCacheDir()/berth. With a
	// zero StateDir, New and fleet.OpenStore first move a store found there into
	// the default when the default has none yet (see
	// statedir.TakeOver); when that fails they refuse with an error
	// wrapping ErrStoreUnavailable rather than open an empty store beside
	// the one holding the reservations. A StateDir that is set, by the
	// program or BERTH_STATE_DIR, is used as it is: nothing is taken over;
	// nor is anything in ModeMRU, which opens no store, or with a StoreDSN.
	//
	// A process running as root never takes the default from another
	// user's home: sudo keeps HOME (and XDG_STATE_HOME), and a directory
	// root created there would belong to root inside that user's home.
	// When the default lies under a directory another user owns, root uses
	// its own state directory instead, the home directory the password
	// database gives uid 0 plus the same path (such as
	// /root/.local/state/berth), and New logs that it did; when that cannot
	// be had either, New refuses with an error wrapping ErrUnsafe that says
	// to set BERTH_STATE_DIR. The previous default follows the same rule
	// (root's own /root/.cache/berth).
	//
	// A StateDir (or a file of berth's in it) that belongs to another
	// user, that others may write, or that is a symbolic link where berth
	// creates its own file is refused with an error wrapping ErrUnsafe and
	// ErrStoreUnavailable, in every mode: it is a refusal to fix, as the
	// error says, not a fault to fall back to the MRU file for.
	StateDir string
	// StoreDSN names a PostgreSQL database to keep the reservations in
	// instead of the SQLite store in StateDir, so that the hosts of a
	// fleet share one range without ever granting a port twice on one
	// host: a connection string ("postgres://user@db.example/berth",
	// "host=/run/postgresql dbname=berth") or the absolute path of the
	// directory of the server's unix socket. A URL's scheme must be
	// postgres:// or postgresql:// in lower case, as libpq takes it; any
	// other string that is not key=value settings is refused (a
	// *FieldError) before berth connects. Messages, logs, Database and
	// every fmt verb of a Config show StoreDSN with its password hidden
	// (pgstore.Redact). Zero: the SQLite store. With
	// a StoreDSN, berth never falls back to the MRU file (its grants would be
	// invisible to the other hosts): a store that cannot be used is an
	// error wrapping ErrStoreUnavailable, and Mode may not be ModeMRU.
	// StateDir still holds nothing of the reservations then.
	//
	// portalloc links no PostgreSQL client: a program opens the database
	// StoreDSN names through package github.com/berth-go/berth/portalloc/fleet
	// (fleet.New, fleet.OpenStore), which does. New refuses a
	// StoreDSN with a *FieldError that says so.
	//
	// The name says what the string is, a data source name as
	// database/sql calls it, and keeps it apart from store.Store, the
	// interface of an open store.
	StoreDSN string
	// Store is StoreDSN under its old name. Both are honoured: a field
	// left as ConfigFromEnv filled it (BERTH_STORE, which fills both) or
	// left zero yields to the other, so that a program that sets or clears
	// Store after ConfigFromEnv goes on working; two set to different
	// databases are refused with a *FieldError for Config.StoreDSN. New
	// and Config() return a Config with both set to the database used.
	//
	// Deprecated: use StoreDSN. A field named Store beside the interface
	// store.Store read as if it held one.
	Store string
	// envStore is what ConfigFromEnv put in StoreDSN and Store: a field
	// that still holds it was not set by the caller since.
	envStore string
	// Host is this host's name in the fleet a StoreDSN is shared by; zero:
	// the hostname. It must name one machine. Without a StoreDSN it is not
	// used.
	Host string
	// Range is where Allocate picks ports; zero: DefaultRange.
	Range Range
	// Exclude lists ports Allocate never hands out. Reserve may still take
	// them: a caller that names a port has chosen it. Allocate also leaves
	// out, whatever Exclude says, Linux's net.ipv4.ip_local_reserved_ports
	// (read by New; Reserve refuses them too, see Request.AllowOSReserved)
	// and, unless AllowBrowserRestricted, the ports browsers refuse.
	// Package portalloc/exclude lists all of it.
	Exclude []Range
	// AllowEphemeralOverlap keeps the OS ephemeral range in Range. When it
	// is false (the zero value) the ephemeral range is cut out of Range,
	// with a warning logged once per process.
	AllowEphemeralOverlap bool
	// AllowBrowserRestricted keeps in Range, and in Request.Prefer, the
	// ports web browsers refuse to connect to (exclude.Browser:
	// 6000, 6665-6669, 10080, ...). When it is false (the zero value)
	// Allocate never hands them out, so that a dev server is never given a
	// port the browser will not open. Reserve takes them either way.
	AllowBrowserRestricted bool
	// Order is the order in which Allocate tries the ports of Range when a
	// Request does not set its own; zero: OrderRandom.
	Order Order
	// Scope keeps this Allocator's labels, sticky ports and sets apart from
	// those of other scopes, so that two checkouts of one project can use
	// the same labels side by side, and each gets its own sticky ports
	// back: "git" (scope.Git, the root of the current git worktree), "dir"
	// (scope.Dir, the working directory) or a name of the caller's own;
	// zero: no scope, the labels as they are. New resolves a mode once (as
	// package portalloc/scope's Resolve does), and Config() returns the
	// scope it resolved to. Each Request.Label is recorded as
	// scope.Label(scope, label), and a labelled request tries
	// the range in an order seeded by the scope and the label. A scope
	// never changes which ports conflict: it names ports, it does not
	// share them.
	Scope string
	// Timeout bounds one Allocate or Reserve, New's opening of the store,
	// and Close's releases; zero: DefaultTimeout.
	Timeout time.Duration
	// Logger receives the Allocator's log; zero: discard, except for the
	// warnings that the Allocator falls back to the MRU file or serves
	// blind, which then go to standard error: a fallback weakens berth's
	// guarantee and must not pass unseen. Per-port detail is logged at
	// V(1).
	Logger logr.Logger
}

// The environment variables ConfigFromEnv reads.
const (
	EnvMode                  = "BERTH_MODE"
	EnvPortRange             = "BERTH_PORT_RANGE"
	EnvPortExclude           = "BERTH_PORT_EXCLUDE"
	EnvStateDir              = "BERTH_STATE_DIR"
	EnvTimeout               = "BERTH_TIMEOUT"
	EnvAllowEphemeralOverlap = "BERTH_ALLOW_EPHEMERAL_OVERLAP"
	EnvLog                   = "BERTH_LOG"
	EnvStore                 = "BERTH_STORE"
	EnvHost                  = "BERTH_HOST"
	// EnvScope gives Config.Scope (see package portalloc/scope).
	EnvScope = "BERTH_SCOPE"
	// EnvAllowBrowserRestricted gives Config.AllowBrowserRestricted.
	EnvAllowBrowserRestricted = "BERTH_ALLOW_BROWSER_RESTRICTED"
)

// ConfigFromEnv returns a Config from the environment: BERTH_MODE,
// BERTH_PORT_RANGE ("20000-32767"), BERTH_PORT_EXCLUDE ("22000-22100,25565"),
// BERTH_STATE_DIR, BERTH_TIMEOUT (a Go duration such as "10s"),
// BERTH_ALLOW_EPHEMERAL_OVERLAP and BERTH_ALLOW_BROWSER_RESTRICTED (true or
// false), BERTH_STORE and
// BERTH_HOST (see Config.StoreDSN and Config.Host), BERTH_SCOPE (see
// Config.Scope; resolved here, against the working directory of the
// moment) and BERTH_LOG. Unset or
// empty variables leave their field at its zero value. The error joins
// one error for each variable refused (errors.Join), each a *FieldError
// naming the variable in its Field and wrapping ErrInvalidRequest. It has
// no "portalloc: " prefix: each line names its variable.
//
// BERTH_LOG sets Logger to an slog text handler on standard error (through
// logr.FromSlogHandler) at one of three levels: "warn" (errors and the
// fallback warnings only), "info" (also decisions worth knowing, such as a
// sticky port that had to move or a range cut by the ephemeral range) or
// "debug" (also each port reserved, and each row of an exited owner
// reaped).
func ConfigFromEnv() (Config, error) { return configFromLookup(os.LookupEnv) }

func configFromLookup(lookup func(string) (string, bool)) (Config, error) {
	var (
		c    Config
		errs []error
	)
	get := func(name string) string {
		v, _ := lookup(name)
		return v
	}
	bad := func(name, value, want string) {
		errs = append(errs, &FieldError{Field: name, Value: value, Want: want})
	}
	if v := get(EnvMode); v != "" {
		if c.Mode = Mode(v); !c.Mode.valid() {
			bad(EnvMode, v, `"statestore", "statestore-with-fallback" or "mru"`)
		}
	}
	if v := get(EnvPortRange); v != "" {
		r, err := portrange.Parse(v)
		if err != nil {
			errs = append(errs, rangeErr(EnvPortRange, err))
		}
		c.Range = Range(r)
	}
	if v := get(EnvPortExclude); v != "" {
		rs, err := portrange.ParseList(v)
		if err != nil {
			errs = append(errs, rangeErr(EnvPortExclude, err))
		}
		c.Exclude = ranges(rs)
	}
	if v := get(EnvStateDir); v != "" {
		c.StateDir = v
	}
	if v := get(EnvStore); v != "" {
		if _, err := storeDSN(v); err != nil {
			errs = append(errs, storeFieldError(EnvStore, v, err))
		}
		c.StoreDSN, c.Store, c.envStore = v, v, v
	}
	c.Host = get(EnvHost)
	if v := get(EnvScope); v != "" {
		s, err := scopes.Resolve(EnvScope, v)
		if err != nil {
			errs = append(errs, err) // the *FieldError
		}
		c.Scope = s
	}
	if v := get(EnvTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			bad(EnvTimeout, v, `a positive Go duration such as "10s" or "1m30s"`)
		}
		c.Timeout = d
	}
	if v := get(EnvAllowEphemeralOverlap); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			bad(EnvAllowEphemeralOverlap, v, `"true" or "false"`)
		}
		c.AllowEphemeralOverlap = b
	}
	if v := get(EnvAllowBrowserRestricted); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			bad(EnvAllowBrowserRestricted, v, `"true" or "false"`)
		}
		c.AllowBrowserRestricted = b
	}
	if v := get(EnvLog); v != "" {
		var level slog.Level
		switch v {
		case "debug":
			level = slog.LevelDebug // logr's V(1) to V(4)
		case "info":
			level = slog.LevelInfo
		case "warn":
			level = slog.LevelWarn
		default:
			bad(EnvLog, v, `"debug", "info" or "warn"`)
		}
		c.Logger = TextLogger(os.Stderr, level)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}

// withDefaults validates c and fills in its zero values.
func (c Config) withDefaults() (Config, error) {
	invalid := func(field, value, want string) error {
		return &FieldError{Field: "Config." + field, Value: value, Want: want}
	}
	switch {
	case c.Mode == "":
		c.Mode = ModeStateStoreWithFallback
	case !c.Mode.valid():
		return Config{}, invalid("Mode", string(c.Mode), `"statestore", "statestore-with-fallback" or "mru"`)
	}
	if c.Range == (Range{}) {
		c.Range = DefaultRange
	} else if err := c.Range.Validate(); err != nil {
		return Config{}, rangeErr("Config.Range", portrange.Range(c.Range).Validate())
	}
	for i, x := range c.Exclude {
		if err := x.Validate(); err != nil {
			return Config{}, rangeErr(fmt.Sprintf("Config.Exclude[%d]", i), portrange.Range(x).Validate())
		}
	}
	db, field, err := c.storeSetting()
	if err != nil {
		return Config{}, err
	}
	c.StoreDSN, c.Store, c.envStore = db, db, db
	if c.StoreDSN != "" {
		if _, err := storeDSN(c.StoreDSN); err != nil {
			return Config{}, storeFieldError(field, c.StoreDSN, err)
		}
		switch c.Mode {
		case ModeMRU:
			return Config{}, &FieldError{Field: "Config.Mode", Value: string(c.Mode), Want: `"statestore" with a Config.StoreDSN: the MRU file cannot share a fleet's reservations`}
		case ModeStateStoreWithFallback:
			c.Mode = ModeStateStore // a fleet's store never falls back
		}
	}
	scope, err := scopes.Resolve("Config.Scope", c.Scope)
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
	if c.StateDir == "" {
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

// storeSetting returns the database c names, by StoreDSN or by its
// deprecated name Store, and the field that named it, for messages. A
// field that still holds what ConfigFromEnv put there (nothing, for a
// Config made otherwise) yields to the other, which the caller set since;
// two fields set to different databases are refused.
func (c Config) storeSetting() (db, field string, err error) {
	switch {
	case c.StoreDSN == c.Store, c.Store == c.envStore:
		return c.StoreDSN, "Config.StoreDSN", nil
	case c.StoreDSN == c.envStore:
		return c.Store, "Config.Store", nil
	}
	return "", "", &FieldError{Field: "Config.StoreDSN", Value: dsn.Redact(c.StoreDSN),
		Want: "one database: Config.Store, its deprecated name, names another (" + dsn.Redact(c.Store) + "); set StoreDSN alone"}
}

// storeWant says what Config.StoreDSN accepts, for error messages.
const storeWant = `a PostgreSQL connection string ("postgres://..." or "postgresql://...", the scheme in lower case, or "host=... dbname=...") or the absolute path of the directory of its unix socket`

// storeDSN returns the pgx connection string that Config.StoreDSN s names: a
// connection string pgstore.CheckDSN takes, or else a socket directory
// (see dsn.FromStore).
func storeDSN(s string) (string, error) { return dsn.FromStore(s) }

// storeFieldError refuses the Config.StoreDSN s, named field (the field, or
// the variable or flag it came from): it quotes s with its password
// hidden, and says why it was refused.
func storeFieldError(field, s string, err error) *FieldError {
	want := storeWant
	var de *dsn.Error
	if errors.As(err, &de) {
		want += " (" + de.Reason + ")"
	}
	return &FieldError{Field: field, Value: dsn.Redact(s), Want: want}
}

// String formats c for people to read, as %v and %+v do, with the
// password of Config.StoreDSN hidden (see pgstore.Redact).
func (c Config) String() string { return fmt.Sprintf("%+v", printedConfig(c)) }

// GoString formats c as %#v does, with the password of Config.StoreDSN
// hidden.
func (c Config) GoString() string { return fmt.Sprintf("%#v", printedConfig(c)) }

// Format formats c for every verb as fmt would format its fields, with
// the password of Config.StoreDSN hidden: no %v, %+v, %#v or %s of a Config
// shows it.
func (c Config) Format(f fmt.State, verb rune) {
	fmt.Fprintf(f, fmt.FormatString(f, verb), printedConfig(c))
}

// configFields is Config without its methods, for printing.
type configFields = Config

// printedConfig returns c as a value of a type of the same name and
// fields but no methods, with StoreDSN's password hidden: %#v shows it as
// portalloc.Config.
func printedConfig(c Config) any {
	type Config configFields
	c.StoreDSN, c.Store, c.envStore = dsn.Redact(c.StoreDSN), dsn.Redact(c.Store), dsn.Redact(c.envStore)
	return Config(c)
}
