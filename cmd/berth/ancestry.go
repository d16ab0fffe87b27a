package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/berth-go/berth/internal/owner"
)

// Which process owns the ports of 'berth get' and 'berth reserve' when
// --owner is left at "parent". berth's parent is the natural owner, but in
// three common cases it exits at once, its ports are reaped while still in
// use, and the next berth is given them again:
//
//   - P=$(berth get | head -1): the shell forks a subshell for the pipeline
//     (and for ( ... )), berth's parent. A fork is a copy of the script's
//     shell: same executable, command line and, on Linux, the same place in
//     memory for its stack and arguments (a new start of a program gets new
//     ones from address space randomisation). berth climbs through such
//     forks to the script's shell, which waits for them; not through one
//     in the background, ( ... ) &, which may outlive the script, and which
//     a non-interactive shell gives /dev/null as its standard input.
//   - A Makefile recipe: make runs each line with sh -c LINE, which exits
//     when the line ends. berth gives the ports to make, which waits for
//     every recipe, and warns, since make exits at the end of the build.
//   - sh -c 'berth get ...' with berth the last command (Python's
//     shell=True): the shell exits right after berth. berth keeps it as the
//     owner, since the program that ran it may live for days and never give
//     the ports back, and warns.
//
// Other systems tell less of a process (see owner.Process): there berth
// goes without the layout and standard-input checks.

// ownerChoice is the process that gets the ports when --owner is left at
// "parent", and why berth took it.
type ownerChoice struct {
	pid   int
	name  string // the owner's name, "" when unknown
	why   string // how berth came to it, for -v
	exits string // when not "": that the owner exits soon after berth, for the warning
}

// invocation is what chooseOwner needs to know of the running berth.
type invocation struct {
	name      string // the name berth was run by, filepath.Base(os.Args[0])
	sub       string // the command: get, reserve, release, transfer
	makeLevel bool   // MAKELEVEL is set: something runs under make
}

// maxClimb bounds the forks berth climbs through: nested subshells are
// rarely more than a few deep, and a loop in a damaged /proc must end.
const maxClimb = 16

// chooseOwner returns the owner berth's parent stands for (see above).
// Where inspect cannot read a process, berth keeps the one it has got to.
func chooseOwner(parent int, inspect func(pid int) (owner.Process, error), self invocation) ownerChoice {
	p, err := inspect(parent)
	if err != nil {
		return ownerChoice{pid: parent, why: "berth's parent"}
	}
	why := "berth's parent"
	forks, bg := 0, false
	for range maxClimb {
		if !isShell(p) || p.PPID <= 1 {
			break
		}
		q, err := inspect(p.PPID)
		if err != nil || !forkOf(p, q) {
			break
		}
		if bg = background(p, q); bg {
			break
		}
		p = q
		forks++
	}
	switch {
	case bg:
		why = "a subshell that runs in the background, ( ... ) &, which may outlive its shell"
	case forks > 0:
		why = fmt.Sprintf("the shell whose forked subshell ran berth (forks climbed: %d)", forks)
	}
	if script, ok := commandString(p); ok && p.PPID > 1 {
		q, err := inspect(p.PPID)
		switch {
		case err == nil && isMake(q, self.makeLevel):
			return ownerChoice{pid: q.PID, name: shownName(q), why: fmt.Sprintf("make, whose recipe shell (pid %d) ran berth", p.PID),
				exits: fmt.Sprintf("%s (pid %d), which ran this recipe line; it exits at the end of the build, and they are handed out again then, even if a program still uses them", shownName(q), q.PID)}
		case err != nil && self.makeLevel:
			return ownerChoice{pid: p.PID, name: shownName(p), why: why,
				exits: fmt.Sprintf("%s (pid %d), the shell of a make recipe line; they are handed out again as soon as the line ends", shownName(p), p.PID)}
		case lastCommand(script, self):
			// The program that ran the shell may live for days (a CI
			// agent): the shell stays the owner, and berth says so.
			return ownerChoice{pid: p.PID, name: shownName(p), why: why,
				exits: fmt.Sprintf("%s (pid %d), which runs berth as the last command of its -c string; it exits right after berth, and they are handed out again at once", shownName(p), p.PID)}
		}
	}
	c := ownerChoice{pid: p.PID, name: shownName(p), why: why}
	if isMake(p, false) {
		c.exits = fmt.Sprintf("%s (pid %d), which ran berth itself; it exits at the end of the build, and they are handed out again then, even if a program still uses them", c.name, p.PID)
	}
	return c
}

// shells and makes are the programs berth takes for shells and make, by
// executable or name.
var shells = map[string]bool{
	"sh": true, "bash": true, "rbash": true, "dash": true, "ash": true, "busybox": true,
	"zsh": true, "ksh": true, "ksh93": true, "mksh": true, "lksh": true, "pdksh": true,
	"oksh": true, "posh": true, "yash": true, "fish": true, "csh": true, "tcsh": true,
}

var makes = map[string]bool{"make": true, "gmake": true, "remake": true, "bmake": true, "pmake": true}

// progName is the base of p's executable, else the kernel's name for it.
func progName(p owner.Process) string {
	if p.Exe != "" {
		return filepath.Base(strings.TrimSuffix(p.Exe, " (deleted)"))
	}
	return p.Name
}

// shownName is the kernel's name for p, as berth ls shows it, else its
// program's.
func shownName(p owner.Process) string { return cmp.Or(p.Name, progName(p)) }

func isShell(p owner.Process) bool { return shells[progName(p)] || shells[p.Name] }

// isMake reports whether p is make; under make, so is a program with
// "make" in its name (mingw32-make, make-4.4).
func isMake(p owner.Process, underMake bool) bool {
	return makes[progName(p)] || makes[p.Name] || underMake && strings.Contains(progName(p), "make")
}

// forkOf reports whether shell p is a fork of its parent q that has not
// exec'd: the same executable, command line and, where known, layout.
func forkOf(p, q owner.Process) bool {
	same := p.Name == q.Name
	if p.Exe != "" && q.Exe != "" {
		same = p.Exe == q.Exe
	}
	return same && p.Args != nil && slices.Equal(p.Args, q.Args) && (p.Layout == "" || q.Layout == "" || p.Layout == q.Layout)
}

// background reports whether the fork p of q runs in the background: a
// non-interactive shell gives ( ... ) & /dev/null as its standard input.
func background(p, q owner.Process) bool {
	return p.Stdin == "/dev/null" && q.Stdin != "" && q.Stdin != "/dev/null"
}

// commandString returns the STRING of shell p's sh -c STRING (or -ec), run
// non-interactively.
func commandString(p owner.Process) (string, bool) {
	if !isShell(p) || len(p.Args) < 2 {
		return "", false
	}
	c, interactive := false, false
	i := 1
	for ; i < len(p.Args); i++ {
		a := p.Args[i]
		if a == "--" || a == "-" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' && a[0] != '+' {
			break
		}
		switch {
		case strings.HasPrefix(a, "--"): // bash's --norc, --posix
		case a[1:] == "o" || a[1:] == "O": // -o pipefail: the next argument is the option's
			i++
		case a[0] == '-':
			c = c || strings.ContainsRune(a, 'c')
			interactive = interactive || strings.ContainsRune(a, 'i')
		}
	}
	if !c || interactive || i >= len(p.Args) {
		return "", false
	}
	return p.Args[i], true
}

// fdRedirect matches the redirections that name a file descriptor
// (2>&1, >&2, <&0, &>): their '&' separates nothing.
var fdRedirect = regexp.MustCompile(`[0-9]*[<>]&[0-9-]*|&>>?`)

// lastCommand reports whether the last mention of berth in a shell's
// command string is this run of it, followed by nothing but arguments and
// redirections: the shell exits right after berth. It errs toward false,
// which keeps the shell as owner.
func lastCommand(script string, self invocation) bool {
	if self.name == "" || self.sub == "" {
		return false
	}
	i := lastWord(script, self.name)
	if i < 0 {
		return false
	}
	rest := fdRedirect.ReplaceAllString(script[i+len(self.name):], " ")
	if strings.ContainsAny(rest, ";&|()`\n{}") || strings.Contains(rest, "$(") {
		return false
	}
	return slices.Contains(strings.Fields(rest), self.sub)
}

// lastWord returns where the last word in s that is word, or ends a path
// in it, starts, or -1.
func lastWord(s, word string) int {
	for end := len(s); ; {
		i := strings.LastIndex(s[:end], word)
		if i < 0 {
			return -1
		}
		after := i + len(word)
		before := i == 0 || strings.ContainsRune(" \t\n/;&|(`{!=", rune(s[i-1]))
		if before && (after == len(s) || strings.ContainsRune(" \t\n", rune(s[after]))) {
			return i
		}
		end = i
	}
}

// defaultOwner returns the pid --owner "parent" stands for (chooseOwner),
// logs at -v which and why, and warns when it exits soon.
func defaultOwner(ctx context.Context, cmd *cobra.Command) int {
	self := invocation{name: filepath.Base(os.Args[0]), sub: cmd.Name(), makeLevel: os.Getenv("MAKELEVEL") != ""}
	c := chooseOwner(os.Getppid(), func(pid int) (owner.Process, error) { return owner.Inspect(ctx, pid) }, self)
	logr.FromContextOrDiscard(ctx).Info("owner of the ports", "pid", c.pid, "name", c.name, "why", c.why)
	// Not when --owner parent was given on purpose.
	if c.exits != "" && (cmd.Name() == "get" || cmd.Name() == "reserve") && !cmd.Flags().Changed("owner") {
		name := cmd.CommandPath()
		msg := fmt.Sprintf("%s: warning: the ports berth hands out here belong to %s\n", name, printable(c.exits)) +
			fmt.Sprintf("%s: to keep a port while it is used: run the program under 'berth run --port NAME -- CMD', pass --owner PID of a process that lives as long (a script's $$), or hold the port under a named lease with --holder NAME --ttl 8h\n", name)
		fmt.Fprint(cmd.ErrOrStderr(), msg)
		if self.makeLevel {
			toTerminal(cmd.ErrOrStderr(), msg)
		}
	}
	return c.pid
}

// toTerminal writes msg to the controlling terminal too, unless standard
// error is that already: make (-s, output synchronisation, a log) would
// bury standard error.
func toTerminal(stderr io.Writer, msg string) {
	if isTerminal(stderr) {
		return
	}
	tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer func() { _ = tty.Close() }()
	_, _ = io.WriteString(tty, msg)
}
