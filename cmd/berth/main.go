// Command berth shows who holds which port and hands out ports to shell
// scripts and Makefiles, through the same state store as berth's Go API.
//
//	berth ls                      reservations: who holds which port, alive or not
//	berth get [--count N]         allocate ports for the calling shell, one per line
//	berth reserve PORT            reserve a given port for the calling shell
//	berth release PORT|--label L|--owner-pid PID
//	berth reap                    delete reservations of exited processes
//	berth doctor                  state store, mode, ranges and outside listeners
//
// A port that get or reserve hands out belongs to the parent process (the
// shell that ran berth) unless --owner-pid names another: it stays reserved
// while that process runs and is reaped after it exits.
//
// Configuration comes from the BERTH_* variables of package portalloc and
// the --state-dir, --range, --mode, --strict and --timeout flags. Every
// command gives up after --timeout (default $BERTH_TIMEOUT, else 30s),
// including its waits for a state store that another process keeps locked;
// a busy store is an error, never a reason to fall back.
//
// When the state store cannot be used, get and reserve hand out ports from
// the MRU file instead and warn on standard error: such a port is only
// remembered, not reserved. --strict (or BERTH_MODE=statestore) makes that
// an error; berth doctor explains the cause and what to do.
//
// Labels and process names come from the state store, where a row written
// by an older berth, another program or a hand can hold anything. ls and
// reap print them escaped: one with a control character, invalid UTF-8 or
// a leading '"' is shown quoted as Go quotes a string ("\x1b]0;pwned\a"),
// and the table shows at most 64 characters of a label and 16 of a process
// name, a longer one cut and ending in "…". ls --json prints them whole,
// with every control and format character as a JSON \u escape. Errors and
// doctor's report are printed escaped too.
//
// Exit codes: 0 success, 1 runtime failure, 2 usage error, 3 port held or
// range exhausted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/portalloc"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitHeld    = 3
)

func main() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) }

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// command is one subcommand.
type command struct {
	name, args, summary, example string
	run                          func(ctx context.Context, env *env, args []string) error
	flags                        func(fs *flag.FlagSet)
}

// env is what every command runs with.
type env struct {
	name           string // the command's
	stdout, stderr io.Writer
	cfg            portalloc.Config // cfg.Timeout is --timeout
	fs             *flag.FlagSet
}

var commands []*command

func register(c *command) { commands = append(commands, c) }

func find(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func topUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: berth COMMAND [flags] [args]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'berth COMMAND --help' for a command's flags and an example.")
	fmt.Fprintln(w, "Exit codes: 0 success, 1 failure, 2 usage error, 3 port held or range exhausted.")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		topUsage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	c := find(args[0])
	if c == nil {
		fmt.Fprintf(stderr, "berth: unknown command %q\n\n", args[0])
		topUsage(stderr)
		return exitUsage
	}
	e := &env{name: c.name, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("berth "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		stateDir, rangeS, mode string
		strict                 bool
		timeout                time.Duration
	)
	fs.StringVar(&stateDir, "state-dir", "", "state directory (default $BERTH_STATE_DIR, else the user cache dir/berth)")
	fs.StringVar(&rangeS, "range", "", "port range FIRST-LAST for allocation (default $BERTH_PORT_RANGE, else 20000-32767)")
	fs.StringVar(&mode, "mode", "", "statestore, statestore-with-fallback or mru (default $BERTH_MODE, else statestore-with-fallback)")
	fs.BoolVar(&strict, "strict", false, "fail when the state store cannot be used instead of falling back to the MRU file (same as --mode statestore)")
	fs.DurationVar(&timeout, "timeout", 0, "give up after this long, waits for a locked store included (default $BERTH_TIMEOUT, else 30s)")
	if c.flags != nil {
		c.flags(fs)
	}
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: berth %s [flags]%s\n\n%s\n\nExample:\n%s\n\nFlags:\n", c.name, c.args, c.summary, c.example)
		fs.PrintDefaults()
	}
	e.fs = fs
	pos, err := parseInterspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	}
	if err != nil {
		return exitUsage // flag already printed the problem and the usage
	}
	cfg, err := portalloc.ConfigFromEnv()
	if err != nil {
		printErr(stderr, "berth "+c.name+": ", err, "")
		return exitUsage
	}
	if stateDir != "" {
		cfg.StateDir = stateDir
	}
	if rangeS != "" {
		if cfg.Range, err = portalloc.ParseRange(rangeS); err != nil {
			fmt.Fprintln(stderr, printable(fmt.Sprintf("berth %s: --range: %v", c.name, err)))
			return exitUsage
		}
	}
	if mode != "" {
		switch cfg.Mode = portalloc.Mode(mode); cfg.Mode {
		case portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback, portalloc.ModeMRU:
		default:
			fmt.Fprintln(stderr, printable(fmt.Sprintf("berth %s: --mode %q: want %q, %q or %q", c.name, mode, portalloc.ModeStateStore, portalloc.ModeStateStoreWithFallback, portalloc.ModeMRU)))
			return exitUsage
		}
	}
	if strict {
		if mode != "" && cfg.Mode != portalloc.ModeStateStore {
			fmt.Fprintln(stderr, printable(fmt.Sprintf("berth %s: --strict with --mode %s: --strict needs the state store; drop --mode or set it to statestore", c.name, mode)))
			return exitUsage
		}
		cfg.Mode = portalloc.ModeStateStore
	}
	switch {
	case timeout < 0 || (timeout == 0 && flagSet(fs, "timeout")):
		fmt.Fprintf(stderr, "berth %s: --timeout %v: want a positive duration such as 10s\n", c.name, timeout)
		return exitUsage
	case timeout > 0:
		cfg.Timeout = timeout
	case cfg.Timeout == 0:
		cfg.Timeout = portalloc.DefaultTimeout
	}
	// Warnings (a fallback to the MRU file above all) go to stderr, as
	// lines of their own unless BERTH_LOG asked for slog's.
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.New(&warnSink{w: stderr, prefix: "berth " + c.name + ": "})
	}
	if cfg.StateDir == "" {
		if cfg.StateDir, err = portalloc.DefaultStateDir(); err != nil {
			fmt.Fprintln(stderr, printable(fmt.Sprintf("berth %s: %v", c.name, err)))
			return exitFailure
		}
	}
	e.cfg = cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	err = c.run(ctx, e, pos)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, context.DeadlineExceeded) {
		printErr(stderr, "berth "+c.name+": ", err, fmt.Sprintf(" (gave up after --timeout %v)", cfg.Timeout))
	} else {
		printErr(stderr, "berth "+c.name+": ", err, "")
	}
	if fix := unsafeFix(err); fix != "" {
		fmt.Fprintf(stderr, "berth %s: to fix: %s\n", c.name, printable(fix))
	}
	var ue *usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, portalloc.ErrInvalidRequest):
		return exitUsage
	case errors.Is(err, portalloc.ErrPortHeld), errors.Is(err, portalloc.ErrRangeExhausted):
		return exitHeld
	default:
		return exitFailure
	}
}

// printErr prints err on w, one line for each error it joins. An error
// can quote what a row of the store holds (a process name, a label), so
// each line is printed escaped (see printable).
func printErr(w io.Writer, prefix string, err error, suffix string) {
	msg := err.Error()
	// An errors.Join: its message is its errors' on lines of their own.
	if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // only the outermost join is split into lines
		errs := j.Unwrap()
		lines := make([]string, len(errs))
		for i, e := range errs {
			lines[i] = e.Error()
		}
		if len(errs) > 1 && msg == strings.Join(lines, "\n") {
			for _, e := range errs {
				printErr(w, prefix, e, suffix)
			}
			return
		}
	}
	fmt.Fprintf(w, "%s%s%s\n", prefix, printable(msg), suffix)
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

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
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

// parseInterspersed parses flags that may come before or after the
// positional arguments ("berth reserve 8080 --udp").
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// colour wraps s in an ANSI colour when stdout is a terminal and NO_COLOR
// is unset.
func colour(w io.Writer, code, s string) string {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("NO_COLOR") != "" {
		return s
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}
