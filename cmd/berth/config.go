package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/scope"
	"github.com/berth-go/berth/portalloc/statedir"
)

// globalFlags are the flags every command takes.
type globalFlags struct {
	stateDir, rangeS, mode, logLevel string
	store, host                      string
	scope                            string
	strict, allowBrowser             bool
	timeout                          time.Duration
	verbose                          int
}

func (g *globalFlags) add(root *cobra.Command) {
	fs := root.PersistentFlags()
	fs.StringVar(&g.stateDir, "state-dir", "", "state directory (default $BERTH_STATE_DIR, else $XDG_STATE_HOME/berth or ~/.local/state/berth; on macOS ~/Library/Application Support/berth, on Windows %LocalAppData%\\berth)")
	fs.StringVar(&g.store, "store", "", "a PostgreSQL database shared by a fleet of hosts, instead of the SQLite store in the state directory: postgres://..., host=... dbname=..., or its unix socket directory (default $BERTH_STORE)")
	fs.StringVar(&g.host, "host", "", "this host's name in the fleet --store is shared by (default $BERTH_HOST, else the hostname)")
	fs.StringVar(&g.scope, "scope", "", `keep labels, sticky ports and sets apart per scope: "git" (the root of the current git worktree), "dir" (the current directory) or a name; "" for none (default $BERTH_SCOPE)`)
	fs.BoolVar(&g.allowBrowser, "allow-browser-restricted", false, "also hand out the ports web browsers refuse to connect to (6000, 6665-6669, 10080, ...; default $BERTH_ALLOW_BROWSER_RESTRICTED, else false)")
	fs.StringVar(&g.rangeS, "range", "", "port range FIRST-LAST that berth hands ports out of (default $BERTH_PORT_RANGE, else 20000-32767)")
	fs.StringVar(&g.mode, "mode", "", "statestore, statestore-with-fallback or mru (default $BERTH_MODE, else statestore-with-fallback)")
	fs.BoolVar(&g.strict, "strict", false, "fail when the state store cannot be used instead of falling back to the MRU file (same as --mode statestore)")
	fs.DurationVar(&g.timeout, "timeout", 0, "give up after this long, waits for a locked store included (default $BERTH_TIMEOUT, else 30s)")
	fs.CountVarP(&g.verbose, "verbose", "v", "log what berth does on standard error: -v info, -vv debug (as --log-level)")
	fs.StringVar(&g.logLevel, "log-level", "", "log on standard error from this level: debug, info or warn (default $BERTH_LOG; without either, only warnings)")
}

// configure builds the configuration of the running command: BERTH_*
// variables, then the flags over them. A value that came from a flag is
// named by that flag in errors, one from a variable by the variable.
func (a *app) configure(cmd *cobra.Command) error {
	g := &a.global
	cfg, err := portalloc.ConfigFromEnv()
	if err != nil {
		return envError(err)
	}
	a.stateDirWhy, a.stateDirDefault = "set by "+portalloc.EnvStateDir, false
	if g.stateDir != "" {
		cfg.StateDir = g.stateDir
		a.stateDirWhy = "--state-dir"
	}
	if g.store != "" {
		cfg.StoreDSN = g.store
	}
	if g.host != "" {
		cfg.Host = g.host
	}
	if a.scopeGiven = cmd.Flags().Changed("scope"); a.scopeGiven {
		s, err := scope.Resolve(g.scope)
		var fe *portalloc.FieldError
		if errors.As(err, &fe) {
			return usagef("--scope %q: want %s", g.scope, fe.Want)
		} else if err != nil {
			return err
		}
		cfg.Scope = s
	}
	if g.allowBrowser {
		cfg.AllowBrowserRestricted = true
	}
	if g.rangeS != "" {
		if cfg.Range, err = portalloc.ParseRange(g.rangeS); err != nil {
			var fe *portalloc.FieldError
			if errors.As(err, &fe) {
				named := *fe
				named.Field = "--range"
				return usagef("%s", named.Error())
			}
			return usagef("--range %q: %v", g.rangeS, err)
		}
	}
	if g.mode != "" {
		switch cfg.Mode = portalloc.Mode(g.mode); cfg.Mode {
		case portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback, portalloc.ModeMRU:
		default:
			return usagef("--mode %q: want %q, %q or %q", g.mode, portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback, portalloc.ModeMRU)
		}
	}
	if g.strict {
		if g.mode != "" && cfg.Mode != portalloc.ModeStateStore {
			return usagef("--strict with --mode %s: --strict needs the state store; drop --mode or set it to statestore", g.mode)
		}
		cfg.Mode = portalloc.ModeStateStore
	}
	switch {
	case g.timeout < 0 || (g.timeout == 0 && cmd.Flags().Changed("timeout")):
		return usagef("--timeout %v: want a positive duration such as 10s", g.timeout)
	case g.timeout > 0:
		cfg.Timeout = g.timeout
	case cfg.Timeout == 0:
		cfg.Timeout = portalloc.DefaultTimeout
	}
	level, err := g.level()
	if err != nil {
		return err
	}
	switch {
	case level != nil:
		cfg.Logger = portalloc.TextLogger(a.stderr, *level)
	case cfg.Logger.GetSink() == nil:
		// Warnings (a fallback to the MRU file above all) go to stderr,
		// as lines of their own unless BERTH_LOG asked for slog's.
		cfg.Logger = logr.New(&warnSink{w: a.stderr, prefix: a.name + ": "})
	}
	if cfg.StateDir == "" {
		if cfg.StateDir, a.stateDirWhy, err = statedir.DefaultReason(); err != nil {
			return err
		}
		a.stateDirDefault = true
	}
	a.cfg = cfg
	return nil
}

// takeOver moves into the default state directory the store left at the
// previous default (os.UserCacheDir()/berth), when the state directory is
// the default, the SQLite store is in use and the default has no store yet
// (see statedir.TakeOver). A command that fills in
// Config.StateDir itself must, or it would open an empty store beside the
// one that holds the reservations.
func (a *app) takeOver(ctx context.Context) error {
	if !a.stateDirDefault || a.cfg.StoreDSN != "" || a.cfg.Mode == portalloc.ModeMRU {
		return nil
	}
	if _, err := statedir.TakeOver(ctx, a.cfg.Logger); err != nil {
		return err
	}
	_, why, err := statedir.DefaultReason()
	if err == nil {
		a.stateDirWhy = why // now with where it was taken over from
	}
	return nil
}

// envError words an error of portalloc.ConfigFromEnv as VARIABLE="value":
// what is wrong, one line for each bad variable (see userVariable). The
// errors still wrap portalloc.ErrInvalidRequest.
func envError(err error) error {
	errs := []error{err}
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) { // ConfigFromEnv joins one error per variable
		errs = j.Unwrap()
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
		var fe *portalloc.FieldError
		if errors.As(e, &fe) {
			out[i] = &userError{msg: userVariable(fe), err: e}
		}
	}
	return errors.Join(out...)
}

// level returns the log level -v or --log-level asks for, or nil.
func (g *globalFlags) level() (*slog.Level, error) {
	var l slog.Level
	switch {
	case g.logLevel != "" && g.verbose > 0:
		return nil, usagef("-v with --log-level %s: give one of them", g.logLevel)
	case g.logLevel != "":
		switch strings.ToLower(g.logLevel) {
		case "debug":
			l = slog.LevelDebug
		case "info":
			l = slog.LevelInfo
		case "warn":
			l = slog.LevelWarn
		default:
			return nil, usagef("--log-level %q: want debug, info or warn", g.logLevel)
		}
	case g.verbose == 1:
		l = slog.LevelInfo
	case g.verbose > 1:
		l = slog.LevelDebug
	default:
		return nil, nil
	}
	return &l, nil
}

// warnSink prints the Allocator's error-level log as warnings, one line
// each, and drops the rest.
type warnSink struct {
	mu     sync.Mutex // guards writes to w
	w      io.Writer
	prefix string
}

func (s *warnSink) Init(logr.RuntimeInfo)          {}
func (s *warnSink) Enabled(int) bool               { return false } // Info is not for the terminal
func (s *warnSink) Info(int, string, ...any)       {}
func (s *warnSink) WithValues(...any) logr.LogSink { return s }
func (s *warnSink) WithName(string) logr.LogSink   { return s }
func (s *warnSink) Error(err error, msg string, _ ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		msg += ": " + err.Error()
	}
	fmt.Fprintf(s.w, "%swarning: %s\n", s.prefix, printable(msg))
}

// unsafeFix says what to do about a state directory berth refuses as
// unsafe (another user's, writable by others, a symbolic link), or "" for
// any other error. berth never falls back to the MRU file for it.
func unsafeFix(err error) string {
	if !errors.Is(err, portalloc.ErrUnsafe) {
		return ""
	}
	var ue *safefs.UnsafeError
	if errors.As(err, &ue) {
		return ue.Fix + "; berth does not fall back to the MRU file for a directory it does not trust"
	}
	return "set --state-dir or " + portalloc.EnvStateDir + " to a directory of your own; berth does not fall back to the MRU file for a directory it does not trust"
}

// version is berth's version as the build recorded it: the module version
// (a release tag, or "(devel)" for a build from a checkout), the commit
// where the build knows it, and the Go release.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "berth (version unknown)"
	}
	v := "berth " + bi.Main.Version
	if v == "berth " {
		v = "berth (devel)"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ", modified"
			}
		}
	}
	if rev != "" {
		v += fmt.Sprintf(" (commit %.12s%s)", rev, dirty)
	}
	return v + " " + bi.GoVersion
}
