package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/owner"
)

// procTable is a process table for chooseOwner: a pid it lacks cannot be
// read.
type procTable map[int]owner.Process

func (pt procTable) inspect(pid int) (owner.Process, error) {
	p, ok := pt[pid]
	if !ok {
		return owner.Process{}, fmt.Errorf("pid %d: %w", pid, owner.ErrNotRunning)
	}
	p.PID = pid
	return p, nil
}

// The processes the tables below are made of, as observed under bash 5,
// dash 0.5 and GNU make 4.3 on Linux.
var (
	terminal = owner.Process{PPID: 1, Name: "sshd", Exe: "/usr/sbin/sshd", Args: []string{"sshd: me@pts/0"}, Layout: "1 1", Stdin: "/dev/pts/0"}
	login    = owner.Process{PPID: 10, Name: "bash", Exe: "/usr/bin/bash", Args: []string{"-bash"}, Layout: "2 2", Stdin: "/dev/pts/0"}
	script   = owner.Process{PPID: 20, Name: "bash", Exe: "/usr/bin/bash", Args: []string{"bash", "s.sh"}, Layout: "3 3", Stdin: "/dev/pts/0"}
)

// fork is a fork of p with parent ppid and standard input stdin ("" for p's).
func fork(p owner.Process, ppid int, stdin string) owner.Process {
	p.PPID = ppid
	if stdin != "" {
		p.Stdin = stdin
	}
	return p
}

func shc(ppid int, script string) owner.Process {
	return owner.Process{PPID: ppid, Name: "sh", Exe: "/usr/bin/dash", Args: []string{"/bin/sh", "-c", script}, Layout: "4 4", Stdin: "/dev/null"}
}

func TestChooseOwner(t *testing.T) {
	base := procTable{10: terminal, 20: login, 30: script}
	with := func(extra procTable) procTable {
		pt := procTable{}
		for k, v := range base {
			pt[k] = v
		}
		for k, v := range extra {
			pt[k] = v
		}
		return pt
	}
	make1 := owner.Process{PPID: 30, Name: "make", Exe: "/usr/bin/make", Args: []string{"make", "-j2"}, Layout: "5 5"}
	py := owner.Process{PPID: 30, Name: "python3", Exe: "/usr/bin/python3.11", Args: []string{"python3", "x.py"}, Layout: "6 6"}
	noCmd := invocation{name: "berth", sub: "get"}
	tests := []struct {
		name   string
		procs  procTable
		parent int
		self   invocation
		want   int
		exits  bool
	}{
		{"a script's P=$(berth get)", base, 30, noCmd, 30, false},
		{"berth get typed at a terminal", base, 20, noCmd, 20, false},
		{"P=$(berth get | head -1)", with(procTable{31: fork(script, 30, "")}), 31, noCmd, 30, false},
		{"P=$( (berth get | head -1) ) in bash", with(procTable{31: fork(script, 30, ""), 32: fork(script, 31, "")}), 32, noCmd, 30, false},
		{"( ... ) & with the script's input a terminal", with(procTable{31: fork(script, 30, "/dev/null")}), 31, noCmd, 31, false},
		{"P=$(berth get | head -1) inside ( ... ) &", with(procTable{31: fork(script, 30, "/dev/null"), 32: fork(script, 31, "")}), 32, noCmd, 31, false},
		{"a script run by itself, bash s.sh from bash s.sh: another layout", with(procTable{31: {PPID: 30, Name: "bash", Exe: "/usr/bin/bash", Args: []string{"bash", "s.sh"}, Layout: "9 9", Stdin: "/dev/pts/0"}}), 31, noCmd, 31, false},
		{"same command line, another executable", with(procTable{31: {PPID: 30, Name: "bash", Exe: "/opt/bash", Args: []string{"bash", "s.sh"}, Layout: "3 3"}}), 31, noCmd, 31, false},
		{"a fork whose layout cannot be read", with(procTable{31: {PPID: 30, Name: "bash", Exe: "/usr/bin/bash", Args: []string{"bash", "s.sh"}}}), 31, noCmd, 30, false},
		{"a fork whose parent cannot be read", procTable{31: fork(script, 30, "")}, 31, noCmd, 31, false},
		{"a program that forks is no shell", with(procTable{40: py, 41: fork(py, 40, "")}), 41, noCmd, 41, false},
		{"a cycle in the process table ends", procTable{50: {PPID: 50, Name: "sh", Exe: "/usr/bin/dash", Args: []string{"sh"}}}, 50, noCmd, 50, false},
		{"parent cannot be read", base, 77, noCmd, 77, false},

		{"make recipe: berth get > .port-a", with(procTable{40: make1, 41: shc(40, "berth get > .port-a")}), 41, noCmd, 40, true},
		{"make recipe that goes on after berth", with(procTable{40: make1, 41: shc(40, "P=$(berth get); ./server --port $P")}), 41, noCmd, 40, true},
		{"make recipe: P=$$(berth get | head -1)", with(procTable{40: make1, 41: shc(40, "P=$(berth get | head -1); echo $P"), 42: fork(shc(40, "P=$(berth get | head -1); echo $P"), 41, "")}), 42, noCmd, 40, true},
		{"make ran berth itself", with(procTable{40: make1}), 40, noCmd, 40, true},
		{"make of another name under MAKELEVEL", with(procTable{40: {PPID: 30, Name: "mingw32-make", Exe: "/opt/mingw32-make"}, 41: shc(40, "berth get > .p")}), 41, invocation{"berth", "get", true}, 40, true},
		{"a recipe whose make cannot be read, under MAKELEVEL", with(procTable{41: shc(40, "berth get > .p; echo")}), 41, invocation{"berth", "get", true}, 41, true},
		{"MAKELEVEL alone does not make a script a recipe", with(procTable{40: make1, 41: shc(40, "./test.sh"), 42: {PPID: 41, Name: "bash", Exe: "/usr/bin/bash", Args: []string{"bash", "./test.sh"}, Layout: "7 7"}}), 42, invocation{"berth", "get", true}, 42, false},

		{"python: subprocess.run('berth get > f', shell=True)", with(procTable{40: py, 41: shc(40, "berth get > f")}), 41, noCmd, 41, true},
		{"sh -c 'berth get' whose parent cannot be read", with(procTable{41: shc(40, "/usr/local/bin/berth --timeout 5s get 2>&1")}), 41, noCmd, 41, true},
		{"sh -c that goes on after berth", with(procTable{40: py, 41: shc(40, "P=$(berth get --label script); echo $P > port.txt; berth ls --label script")}), 41, noCmd, 41, false},
		{"sh -c whose last berth is another command", with(procTable{40: py, 41: shc(40, "berth get --label a > a; berth ls")}), 41, noCmd, 41, false},
		{"sh -c 'berth get && exec server'", with(procTable{40: py, 41: shc(40, "berth get > p && exec ./server")}), 41, noCmd, 41, false},
		{"sh -c run from a script, berth last", with(procTable{41: shc(30, "berth reserve 8080 >/dev/null")}), 41, invocation{"berth", "reserve", false}, 41, true},
		{"an interactive bash -i -c is left alone", with(procTable{40: py, 41: {PPID: 40, Name: "bash", Exe: "/usr/bin/bash", Args: []string{"bash", "-i", "-c", "berth get"}}}), 41, noCmd, 41, false},
	}
	for _, tt := range tests {
		got := chooseOwner(tt.parent, tt.procs.inspect, tt.self)
		if got.pid != tt.want || (got.exits != "") != tt.exits {
			t.Errorf("%s: chooseOwner(%d) = pid %d, exits %q (%s); want pid %d, exits %v", tt.name, tt.parent, got.pid, got.exits, got.why, tt.want, tt.exits)
		}
	}
}

func TestCommandString(t *testing.T) {
	sh := func(args ...string) owner.Process { return owner.Process{Name: "sh", Exe: "/bin/dash", Args: args} }
	tests := []struct {
		p    owner.Process
		want string
		ok   bool
	}{
		{sh("sh", "-c", "berth get"), "berth get", true},
		{sh("/bin/sh", "-ec", "berth get", "sh", "x"), "berth get", true},
		{sh("bash", "--norc", "-o", "pipefail", "-c", "x"), "x", true},
		{sh("bash", "-i", "-c", "x"), "", false},
		{sh("bash", "s.sh"), "", false},
		{sh("bash"), "", false},
		{sh("sh", "-c"), "", false},
		{owner.Process{Name: "python3", Args: []string{"python3", "-c", "x"}}, "", false},
	}
	for _, tt := range tests {
		if got, ok := commandString(tt.p); got != tt.want || ok != tt.ok {
			t.Errorf("commandString(%q) = %q, %v; want %q, %v", tt.p.Args, got, ok, tt.want, tt.ok)
		}
	}
}

func TestLastCommand(t *testing.T) {
	get := invocation{name: "berth", sub: "get"}
	tests := []struct {
		script string
		want   bool
	}{
		{"berth get", true},
		{"berth get > .port-a", true},
		{"cd web && berth get --label web > .port 2>&1", true},
		{"exec /usr/local/bin/berth -v get --count 2 &>ports", true},
		{"berth get; true", false},
		{"berth get | head -1", false},
		{"P=$(berth get)", false},
		{"berth get > p && ./server", false},
		{"berth get\n./server", false},
		{"berth reserve 8080", false},
		{"berthold get", false},
		{"echo berth get; berth ls", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := lastCommand(tt.script, get); got != tt.want {
			t.Errorf("lastCommand(%q) = %v; want %v", tt.script, got, tt.want)
		}
	}
	if lastCommand("berth get", invocation{}) {
		t.Error("lastCommand(\"berth get\", no name) = true; want false")
	}
	// The warning of an owner that exits soon names the fix.
	c := chooseOwner(41, procTable{40: {PPID: 1, Name: "make", Exe: "/usr/bin/make"}, 41: shc(40, "berth get > .p")}.inspect, get)
	if !strings.Contains(c.exits, "make (pid 40)") {
		t.Errorf("chooseOwner(recipe).exits = %q; want it to name make (pid 40)", c.exits)
	}
}

// FuzzShellCommand: a command line read from /proc can hold anything;
// reading it never panics, and berth is taken for the last command only
// where the string names it.
func FuzzShellCommand(f *testing.F) {
	for _, s := range []string{"berth get", "berth get > .p 2>&1", "P=$(berth get); x", "/x/berth -v get &>f", "berth", "get berth", "berth\tget\n", ""} {
		f.Add(s)
	}
	get := invocation{name: "berth", sub: "get"}
	f.Fuzz(func(t *testing.T, s string) {
		if lastCommand(s, get) && (!strings.Contains(s, "berth") || !strings.Contains(s, "get")) {
			t.Errorf("lastCommand(%q) = true; want false: it does not name berth get", s)
		}
		for _, args := range [][]string{{"sh", "-c", s}, {"sh", s}, {"sh", s, "-c", s}} {
			_, _ = commandString(owner.Process{Name: "sh", Args: args})
		}
	})
}
