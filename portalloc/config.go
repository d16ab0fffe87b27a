package portalloc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/portrange"
)

// Mode selects the backend an Allocator reserves ports with.
type Mode string

// The modes.
const (
	// ModeStateStore reserves in the SQLite state store only; a store
	// failure is an error wrapping ErrStoreUnavailable.
	ModeStateStore Mode = "statestore"
	// ModeStateStoreWithFallback reserves in the state store and, when it
	// cannot be used (not merely busy), falls back to the MRU allocator,
	// logging the switch; the MRU allocator still skips the ports the store
	// holds while its database can be read. The store is tried again every
	// StoreRetryInterval. See the package documentation.
	ModeStateStoreWithFallback Mode = "statestore-with-fallback"
	// ModeMRU uses the legacy MRU-file allocator only.
	ModeMRU Mode = "mru"
)

func (m Mode) valid() bool {
	return m == ModeStateStore || m == ModeStateStoreWithFallback || m == ModeMRU
}

// Protocol is the transport a port is allocated for.
type Protocol string

// The protocols.
const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
)

// Range is the ports First through Last, both included.
type Range = portrange.Range

// DefaultRange is 20000-32767: below the Linux ephemeral range (32768-60999)
// and the Windows and macOS dynamic range (49152-65535), so the OS never
// hands one of its ports to an outgoing connection.
var DefaultRange = Range{First: 20000, Last: 32767}

// DefaultTimeout bounds one Allocate or Reserve when Config.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// ParseRange parses "FIRST-LAST" (e.g. "20000-32767") or a single port
// ("25565"). Ports run from 1 to 65535, FIRST <= LAST; no spaces or signs.
// Errors wrap ErrInvalidRequest.
func ParseRange(s string) (Range, error) {
	r, err := portrange.Parse(s)
	if err != nil {
		return Range{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return r, nil
}

// ParseRanges parses a comma-separated list of ranges, such as
// "22000-22100,25565". Errors wrap ErrInvalidRequest.
func ParseRanges(s string) ([]Range, error) {
	rs, err := portrange.ParseList(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return rs, nil
}

// Config configures an Allocator. The zero value of every field is a working
// default; New parses and validates it once.
type Config struct {
	// Mode selects the backend; zero: ModeStateStoreWithFallback.
	Mode Mode
	// StateDir holds the state store (berth.db) and the MRU file
	// (mru.json); zero: os.UserCacheDir()/berth. It is created with mode
	// 0700, its files with 0600.
	StateDir string
	// Range is where Allocate picks ports; zero: DefaultRange.
	Range Range
	// Exclude lists ports Allocate never hands out. Reserve may still take
	// them: a caller that names a port has chosen it.
	Exclude []Range
	// AllowEphemeralOverlap keeps the OS ephemeral range in Range. When it
	// is false (the zero value) the ephemeral range is cut out of Range,
	// with a warning logged once per process.
	AllowEphemeralOverlap bool
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
)

// ConfigFromEnv returns a Config from the environment: BERTH_MODE,
// BERTH_PORT_RANGE ("20000-32767"), BERTH_PORT_EXCLUDE ("22000-22100,25565"),
// BERTH_STATE_DIR, BERTH_TIMEOUT (a Go duration such as "10s") and
// BERTH_ALLOW_EPHEMERAL_OVERLAP (true or false). Unset or empty variables
// leave their field at its zero value. Errors name the variable and wrap
// ErrInvalidRequest.
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
		errs = append(errs, fmt.Errorf("%w: %s=%q: want %s", ErrInvalidRequest, name, value, want))
	}
	if v := get(EnvMode); v != "" {
		if c.Mode = Mode(v); !c.Mode.valid() {
			bad(EnvMode, v, `"statestore", "statestore-with-fallback" or "mru"`)
		}
	}
	if v := get(EnvPortRange); v != "" {
		r, err := portrange.Parse(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w", ErrInvalidRequest, EnvPortRange, err))
		}
		c.Range = r
	}
	if v := get(EnvPortExclude); v != "" {
		rs, err := portrange.ParseList(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w", ErrInvalidRequest, EnvPortExclude, err))
		}
		c.Exclude = rs
	}
	if v := get(EnvStateDir); v != "" {
		c.StateDir = v
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
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}

// withDefaults validates c and fills in its zero values.
func (c Config) withDefaults() (Config, error) {
	invalid := func(field, value, want string) error {
		return fmt.Errorf("%w: Config.%s %s: want %s", ErrInvalidRequest, field, value, want)
	}
	switch {
	case c.Mode == "":
		c.Mode = ModeStateStoreWithFallback
	case !c.Mode.valid():
		return Config{}, invalid("Mode", strconv.Quote(string(c.Mode)), `"statestore", "statestore-with-fallback" or "mru"`)
	}
	if c.Range == (Range{}) {
		c.Range = DefaultRange
	} else if err := c.Range.Valid(); err != nil {
		return Config{}, fmt.Errorf("%w: Config.Range: %w", ErrInvalidRequest, err)
	}
	for i, x := range c.Exclude {
		if err := x.Valid(); err != nil {
			return Config{}, fmt.Errorf("%w: Config.Exclude[%d]: %w", ErrInvalidRequest, i, err)
		}
	}
	switch {
	case c.Timeout == 0:
		c.Timeout = DefaultTimeout
	case c.Timeout < 0:
		return Config{}, invalid("Timeout", c.Timeout.String(), "a positive duration, or zero for the default")
	}
	if c.StateDir == "" {
		dir, err := DefaultStateDir()
		if err != nil {
			return Config{}, err
		}
		c.StateDir = dir
	}
	if strings.ContainsRune(c.StateDir, 0) {
		return Config{}, invalid("StateDir", strconv.Quote(c.StateDir), "a directory path")
	}
	return c, nil
}

// The files an Allocator keeps in its state directory.
const (
	DatabaseFile = "berth.db" // the SQLite state store
	MRUFile      = "mru.json" // the MRU fallback's record
)

// EphemeralRange returns the range the OS picks outgoing connections' local
// ports from (read once per process), and an error if it had to assume the
// IANA range 49152-65535.
func EphemeralRange() (Range, error) { return portrange.Ephemeral() }

// DefaultStateDir returns the state directory used when Config.StateDir is
// empty: os.UserCacheDir()/berth.
func DefaultStateDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("portalloc: no default state directory (%w); set %s or Config.StateDir", err, EnvStateDir)
	}
	return filepath.Join(base, "berth"), nil
}
