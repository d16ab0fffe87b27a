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
// the --state-dir, --range and --mode flags.
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
	stdout, stderr io.Writer
	cfg            portalloc.Config
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
	e := &env{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("berth "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var stateDir, rangeS, mode string
	fs.StringVar(&stateDir, "state-dir", "", "state directory (default $BERTH_STATE_DIR, else the user cache dir/berth)")
	fs.StringVar(&rangeS, "range", "", "port range FIRST-LAST for allocation (default $BERTH_PORT_RANGE, else 20000-32767)")
	fs.StringVar(&mode, "mode", "", "statestore, statestore-with-fallback or mru (default $BERTH_MODE, else statestore-with-fallback)")
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
		fmt.Fprintf(stderr, "berth %s: %v\n", c.name, err)
		return exitUsage
	}
	if stateDir != "" {
		cfg.StateDir = stateDir
	}
	if rangeS != "" {
		if cfg.Range, err = portalloc.ParseRange(rangeS); err != nil {
			fmt.Fprintf(stderr, "berth %s: --range: %v\n", c.name, err)
			return exitUsage
		}
	}
	if mode != "" {
		cfg.Mode = portalloc.Mode(mode)
	}
	if cfg.StateDir == "" {
		if cfg.StateDir, err = portalloc.DefaultStateDir(); err != nil {
			fmt.Fprintf(stderr, "berth %s: %v\n", c.name, err)
			return exitFailure
		}
	}
	e.cfg = cfg
	err = c.run(ctx, e, pos)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "berth %s: %v\n", c.name, err)
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
