// Command berth hands out ports to shell scripts and Makefiles, runs
// programs with ports of their own, and shows who holds which port, through
// the same state store as berth's Go API; 'berth --help' lists its commands.
//
// A port belongs to a process: it stays reserved while that process runs
// and is reaped after it exits. berth run execs COMMAND in its own place,
// so COMMAND owns its ports for exactly as long as it runs. get and reserve
// give their ports to the process berth's parent stands for (see
// ancestry.go) unless --owner names another.
//
// Configuration comes from the BERTH_* variables of package portalloc and
// the global flags. A busy store is an error, never a reason to fall back to
// the MRU file, and so is running out of file descriptors, memory or disk
// space: the MRU file is for a store that cannot be used at all, and a port
// it hands out is locked for its owner but recorded nowhere.
//
// Labels and process names come from the state store, where a row can hold
// anything: berth prints them escaped (see escape.go).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitHeld    = 3
	exitNoLease = 4 // the holder has no port (or no lease that has not ended)
)

// The first arguments of berth run again by itself: to place the sockets
// of --listen (execCommand), and to remove --env-file (startEnvFileWatch).
const (
	placeArg    = "__berth-place-sockets"
	envWatchArg = "__berth-env-file-watch"
)

func main() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) }

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// app is one run of berth: its output and the flags every command shares.
type app struct {
	stdout, stderr io.Writer
	global         globalFlags
	cfg            portalloc.Config // set by configure; cfg.Timeout is --timeout
	stateDirWhy    string           // why cfg.StateDir is where it is, for doctor
	// scopeGiven: --scope was given, so ls and release --all keep to the
	// scope (BERTH_SCOPE alone scopes labels only).
	scopeGiven bool
	name       string // the running command's, for messages
	ran        bool   // a command's own code ran (its errors are not usage errors by default)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == placeArg {
		return placeAndExec(args[1:], stderr)
	}
	if len(args) > 0 && args[0] == envWatchArg {
		return watchEnvFile(args[1:])
	}
	a := &app{stdout: stdout, stderr: stderr}
	root := a.root() //nolint:contextcheck // commands get ctx through ExecuteContextC and cmd.Context()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	name := "berth"
	if cmd != nil && cmd != root {
		name = cmd.CommandPath()
	}
	var ec *exitCode
	if errors.As(err, &ec) { // berth run's COMMAND's, which said why itself
		return ec.code
	}
	err = inUserWords(err)
	if errors.Is(err, context.DeadlineExceeded) {
		printErr(stderr, name+": ", err, fmt.Sprintf(" (gave up after --timeout %v)", a.cfg.Timeout))
	} else {
		printErr(stderr, name+": ", err, "")
	}
	if fix := unsafeFix(err); fix != "" && !strings.Contains(err.Error(), strings.SplitN(fix, ";", 2)[0]) {
		fmt.Fprintf(stderr, "%s: to fix: %s\n", name, printable(fix))
	}
	var ue *usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, store.ErrInvalid), !a.ran:
		if cmd != nil && !errors.Is(err, store.ErrInvalid) {
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return exitUsage
	case errors.Is(err, errNoLease):
		return exitNoLease
	case errors.Is(err, store.ErrHeld), errors.Is(err, store.ErrExhausted), errors.Is(err, errNoReservation):
		return exitHeld
	default:
		return exitFailure
	}
}

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "berth",
		Short: "Ports for programs, scripts and tests that are never handed out twice",
		Long: `berth hands out TCP and UDP ports that no other program is given while their
owner runs, and takes them back when it exits, crashed or not.

A port belongs to a process. 'berth run' starts a program that owns its ports
for exactly as long as it runs; 'berth get' and 'berth reserve' give theirs to
the shell that ran berth (or to --owner), and 'berth transfer' hands them on.

A port can also belong to a named holder instead (--holder NAME --ttl D): it
outlives the shell, until 'berth release --holder' or until its lease ends;
'berth renew' extends the lease.

Exit codes: 0 success, 1 failure, 2 usage error, 3 port held, range exhausted or
(berth port) no live reservation of the label, 4 the holder has no port whose
lease has not ended.`,
		Example: `  berth run --port web -- sh -c './server --listen=:$WEB_PORT'
  PORT=$(berth get --label api)
  berth ls`,
		Version:       version(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// No command: the help, on standard output.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		// A word that is not a command: a usage error with suggestions.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf(" (did you mean %q?)", s[0])
			}
			return &usageError{msg}
		},
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: false},
	}
	root.SuggestionsMinimumDistance = 2
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(flagError)
	a.global.add(root)
	root.AddCommand(a.runCmd(), a.getCmd(), a.reserveCmd(), a.renewCmd(), a.transferCmd(), a.releaseCmd(), a.lsCmd(), a.portCmd(), a.envCmd(), a.whoCmd(), a.reapCmd(), a.doctorCmd(), a.hostCmd(), a.fleetCmd())
	return root
}

// action wraps a command's work: the configuration first (flags over
// BERTH_* variables), then fn, within --timeout's deadline.
func (a *app) action(fn func(ctx context.Context, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.name = cmd.CommandPath()
		a.ran = true // from here, errors are usage errors only if they say so
		if err := a.configure(cmd); err != nil {
			return err
		}
		cmd.SetContext(logr.NewContext(cmd.Context(), a.cfg.Logger)) // for what logs outside fn (defaultOwner)
		ctx, cancel := context.WithTimeout(cmd.Context(), a.cfg.Timeout)
		defer cancel()
		return fn(ctx, args)
	}
}

// flagError turns a flag the command does not know, or a bad flag value,
// into a usage error, with the nearest flag name as a suggestion.
func flagError(cmd *cobra.Command, err error) error {
	var ive *pflag.InvalidValueError
	if errors.As(err, &ive) {
		// pflag's words name the flag but end in strconv's ("strconv.ParseInt:
		// parsing "x": invalid syntax"): say what the flag takes instead.
		return usagef("--%s %q: want %s", ive.GetFlag().Name, ive.GetValue(), flagWant(ive.GetFlag()))
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		if s := nearestFlag(cmd, name); s != "" {
			msg += fmt.Sprintf(" (did you mean --%s?)", s)
		}
	}
	return &usageError{msg}
}

// flagWant says what a flag of f's type takes, for a value pflag refused.
func flagWant(f *pflag.Flag) string {
	switch f.Name {
	case "to", "owner", "owner-pid":
		return "a process id above 0"
	}
	if want, ok := map[string]string{
		"int":       "a whole number",
		"uintSlice": "port numbers from 1 to 65535, comma-separated, such as 3000,3001",
		"duration":  "a duration such as 10s or 1m30s",
		"bool":      "true or false",
	}[f.Value.Type()]; ok {
		return want
	}
	return "a value of type " + f.Value.Type()
}

// nearestFlag returns cmd's flag within two edits of name, or starting
// with it, or "".
func nearestFlag(cmd *cobra.Command, name string) string {
	best, bestD := "", 3
	visit := func(f string) {
		d := editDistance(name, f)
		if strings.HasPrefix(f, name) {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f, d
		}
	}
	cmd.Flags().VisitAll(func(f *pflag.Flag) { visit(f.Name) })
	cmd.InheritedFlags().VisitAll(func(f *pflag.Flag) { visit(f.Name) })
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// printErr prints err on w, a line for each error it joins, escaped: it can
// quote what a row holds.
func printErr(w io.Writer, prefix string, err error, suffix string) {
	if errs := joinedErrs(err); errs != nil {
		for _, e := range errs {
			printErr(w, prefix, e, suffix)
		}
		return
	}
	fmt.Fprintf(w, "%s%s%s\n", prefix, printable(err.Error()), suffix)
}

// joinedErrs returns the errors of the outermost errors.Join of several,
// whose message is theirs on lines of their own, else nil.
func joinedErrs(err error) []error {
	j, ok := err.(interface{ Unwrap() []error }) //nolint:errorlint // only the outermost join is split into lines
	if !ok {
		return nil
	}
	errs := j.Unwrap()
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = e.Error()
	}
	if len(errs) < 2 || err.Error() != strings.Join(lines, "\n") {
		return nil
	}
	return errs
}

// colour wraps s in an ANSI colour on a terminal, unless NO_COLOR is set.
func colour(w io.Writer, code, s string) string {
	if !isTerminal(w) || os.Getenv("NO_COLOR") != "" {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

// isTerminal reports whether w is a character device (/dev/null too).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
