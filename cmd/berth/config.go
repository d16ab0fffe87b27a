package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// globalFlags are the flags every command takes.
type globalFlags struct {
	stateDir, rangeS, mode, logLevel string
	store, host                      string
	scope                            string
	strict, allowBrowser             bool
	allowPrivileged                  bool
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
	fs.BoolVar(&g.allowPrivileged, "allow-privileged", false, "let --range reach below port 1024, where ports belong to system services (default $BERTH_ALLOW_PRIVILEGED, else false)")
	fs.StringVar(&g.mode, "mode", "", "statestore, statestore-with-fallback or mru (default $BERTH_MODE, else statestore-with-fallback)")
	fs.BoolVar(&g.strict, "strict", false, "fail when the state store cannot be used instead of falling back to the MRU file (same as --mode statestore)")
	fs.DurationVar(&g.timeout, "timeout", 0, "give up after this long, waits for a locked store included (default $BERTH_TIMEOUT, else 30s)")
	fs.CountVarP(&g.verbose, "verbose", "v", "log what berth does on standard error: -v info, -vv debug (as --log-level)")
	fs.StringVar(&g.logLevel, "log-level", "", "log on standard error from this level: debug, info or warn (default $BERTH_LOG; without either, only warnings)")
}

// configure builds the running command's configuration: the flags, then the BERTH_*
// variables (Config.Resolve), then the defaults. Errors name the flag or variable a value
// came from.
func (a *app) configure(cmd *cobra.Command) error {
	g := &a.global
	var cfg portalloc.Config
	switch {
	case g.stateDir != "":
		cfg.StateDir, a.stateDirWhy = g.stateDir, "--state-dir"
	case os.Getenv("BERTH_STATE_DIR") != "":
		a.stateDirWhy = "set by BERTH_STATE_DIR"
	}
	cfg.StoreDSN, cfg.Host = g.store, g.host
	if a.scopeGiven = cmd.Flags().Changed("scope"); a.scopeGiven {
		s, err := portalloc.ResolveScope(g.scope)
		var fe *store.FieldError
		if errors.As(err, &fe) {
			return usagef("--scope %q: want %s", g.scope, fe.Want)
		} else if err != nil {
			return err
		}
		if s == "" {
			// --scope "": none, whatever BERTH_SCOPE says, here and in what berth run
			// starts.
			_ = os.Unsetenv("BERTH_SCOPE")
		}
		cfg.Scope = s
	}
	cfg.AllowBrowserRestricted, cfg.AllowPrivileged = g.allowBrowser, g.allowPrivileged
	if g.rangeS != "" {
		r, err := store.ParseRange(g.rangeS)
		if err != nil {
			var fe *store.FieldError
			if errors.As(err, &fe) {
				named := *fe
				named.Field = "--range"
				return usagef("%s", named.Error())
			}
			return usagef("--range %q: %v", g.rangeS, err)
		}
		if r.First < 1024 && !g.allowPrivileged {
			return usagef("--range %q: want ports from 1024 up; ports below 1024 belong to system services: add --allow-privileged to hand them out", g.rangeS)
		}
		cfg.Range = r
	}
	switch cfg.Mode = portalloc.Mode(g.mode); cfg.Mode {
	case "", portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback, portalloc.ModeMRU:
	default:
		return usagef("--mode %q: want %q, %q or %q", g.mode, portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback, portalloc.ModeMRU)
	}
	if g.strict {
		if g.mode != "" && cfg.Mode != portalloc.ModeStateStore {
			return usagef("--strict with --mode %s: --strict needs the state store; drop --mode or set it to statestore", g.mode)
		}
		cfg.Mode = portalloc.ModeStateStore
	}
	if g.timeout < 0 || (g.timeout == 0 && cmd.Flags().Changed("timeout")) {
		return usagef("--timeout %v: want a positive duration such as 10s", g.timeout)
	}
	cfg.Timeout = g.timeout
	level := strings.ToLower(g.logLevel)
	switch {
	case g.logLevel != "" && g.verbose > 0:
		return usagef("-v with --log-level %s: give one of them", g.logLevel)
	case g.verbose > 0:
		level = []string{"info", "debug"}[min(g.verbose, 2)-1]
	}
	if l, ok := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn}[level]; ok {
		cfg.Logger = portalloc.TextLogger(a.stderr, l)
	} else if level != "" {
		return usagef("--log-level %q: want debug, info or warn", g.logLevel)
	}
	cfg, err := cfg.Resolve()
	if err != nil {
		return envError(err)
	}
	if cfg.Logger.GetSink() == nil {
		// Warnings (a fallback to the MRU file above all) go to stderr, as lines of their
		// own unless BERTH_LOG asked for slog's.
		cfg.Logger = logr.New(&warnSink{w: a.stderr, prefix: a.name + ": "})
	}
	if a.stateDirWhy == "" {
		if _, why, err := portalloc.DefaultStateDir(); err == nil {
			a.stateDirWhy = why
		}
	}
	a.cfg = cfg
	return nil
}

// envError words an error of the configuration: VARIABLE="value": what is wrong, a line
// for each, else as inUserWords does; still wrapping it.
func envError(err error) error {
	var oe *portalloc.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	errs := joinedErrs(err) // one error per variable
	if errs == nil {
		errs = []error{err}
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		var fe *store.FieldError
		if errors.As(e, &fe) && strings.HasPrefix(fe.Field, "BERTH_") {
			out[i] = &userError{msg: fe.Field + "=" + strings.TrimPrefix(fe.Error(), fe.Field+" "), err: e}
		} else {
			out[i] = inUserWords(e)
		}
	}
	return errors.Join(out...)
}

// warnSink prints the Allocator's error-level log as warning lines.
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

// unsafeFix says what to do about a state directory berth refuses as unsafe, or "" for
// any other error.
func unsafeFix(err error) string {
	if !errors.Is(err, store.ErrUnsafe) {
		return ""
	}
	var ue *safefs.UnsafeError
	if errors.As(err, &ue) {
		return ue.Fix + "; berth does not fall back to the MRU file for a directory it does not trust"
	}
	return "set --state-dir or BERTH_STATE_DIR to a directory of your own; berth does not fall back to the MRU file for a directory it does not trust"
}

// version is the module version (or "(devel)"), the commit where known, and the Go
// release, as the build recorded them.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "berth (version unknown)"
	}
	v := "berth " + cmp.Or(bi.Main.Version, "(devel)")
	vcs := map[string]string{}
	for _, s := range bi.Settings {
		vcs[s.Key] = s.Value
	}
	if rev := vcs["vcs.revision"]; rev != "" {
		v += fmt.Sprintf(" (commit %.12s%s)", rev, map[string]string{"true": ", modified"}[vcs["vcs.modified"]])
	}
	return v + " " + bi.GoVersion
}
