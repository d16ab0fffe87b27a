package owner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var host = &procFS{fsys: os.DirFS("/proc"), root: os.Geteuid() == 0}

// procFS is a kernel read from a /proc file system, through fsys. It never
// reads /proc/uptime or the btime of /proc/stat, so no boot time, and hence
// no wall clock, enters an identity or a liveness verdict; tests hold it to
// that with an fsys that refuses those files.
type procFS struct {
	fsys fs.FS

	once sync.Once // guards own, the calling process's scope
	own  scope
	root bool // the caller is root: no process is hidden from it
}

func (p *procFS) read(_ context.Context, pid int) (reading, error) {
	b, err := fs.ReadFile(p.fsys, strconv.Itoa(pid)+"/stat")
	if err != nil {
		// /proc hides other users' processes when mounted with hidepid,
		// a process may vanish while its file is read, and a process out
		// of descriptors cannot open the file at all: only the kernel's
		// own answer to a signal, which takes no descriptor, says that no
		// process has the pid.
		if !exists(pid) {
			return reading{}, errGone
		}
		return reading{}, err
	}
	st, err := parseStat(b)
	if err != nil {
		return reading{}, err
	}
	if st.pid != pid {
		return reading{}, fmt.Errorf("%s/stat is of pid %d", strconv.Itoa(pid), st.pid)
	}
	// Z: exited, waiting for its parent; X: being torn down. But a
	// process's first thread shows Z as soon as it has exited itself,
	// while its other threads are still on their way out: the last of
	// them closes the process's files, its sockets among them. Killed, a
	// multi-threaded process (any Go program) holds its ports for that
	// while, and a port handed on then is still bound. So a zombie has
	// exited once it is its only thread left, as the count of the same
	// line says: /proc/PID/task of a zombie leader can list it alone while
	// other threads are still exiting.
	exited := st.state == 'X' || st.state == 'Z' && st.threads <= 1
	return reading{start: st.start, exited: exited}, nil
}

func (p *procFS) scope() scope {
	p.once.Do(func() {
		if b, err := fs.ReadFile(p.fsys, "sys/kernel/random/boot_id"); err == nil {
			p.own.boot = strings.TrimSpace(string(b))
		}
		p.own.pidNS = nsInode(p.fsys, "self/ns/pid")
		p.own.timeNS = nsInode(p.fsys, "self/ns/time") // Linux 5.6 and later
	})
	return p.own
}

// nsInode returns the inode number a namespace link names, or "".
func nsInode(fsys fs.FS, name string) string {
	l, err := fs.ReadLink(fsys, name)
	if err != nil {
		return ""
	}
	_, l, _ = strings.Cut(l, "[")
	l, _, _ = strings.Cut(l, "]")
	return l
}

// initPidNS is the inode number of the initial pid namespace
// (PROC_PID_INIT_INO): a process in it sees every process of the host.
const initPidNS = "4026531836"

// pidNSGone can know only in the initial pid namespace, where every process
// of the host is listed, and as root, whom neither hidepid nor ptrace rules
// hide any process from.
func (p *procFS) pidNSGone(ns string) bool {
	if p.scope().pidNS != initPidNS || !p.root {
		return false
	}
	entries, err := fs.ReadDir(p.fsys, ".")
	if err != nil {
		return false
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		l, err := fs.ReadLink(p.fsys, e.Name()+"/ns/pid")
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // exited while listed
		case err != nil:
			// Some processes keep their links from root too (another user
			// namespace's init). One whose NSpid lists a single pid is in
			// this, the initial, namespace, so not in ns.
			if p.ownNamespaceOnly(e.Name()) {
				continue
			}
			return false
		}
		if _, inode, _ := strings.Cut(l, "["); strings.TrimSuffix(inode, "]") == ns {
			return false
		}
	}
	return true
}

// ownNamespaceOnly reports whether process pid (a /proc entry name) is in
// no pid namespace below the caller's: its status lists one pid in NSpid.
func (p *procFS) ownNamespaceOnly(pid string) bool {
	b, err := fs.ReadFile(p.fsys, pid+"/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			return len(strings.Fields(rest)) == 1
		}
	}
	return false
}

// wallMillis places a start in clock ticks since boot on the wall clock as
// it reads now. It reads the clocks (CLOCK_BOOTTIME counts the same time
// as starttime, suspend included), never /proc.
func (p *procFS) wallMillis(start int64) (int64, bool) {
	var real, boot unix.Timespec
	if unix.ClockGettime(unix.CLOCK_REALTIME, &real) != nil || unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot) != nil {
		return 0, false
	}
	hz := clockTicks()
	startNs := start/hz*1e9 + start%hz*1e9/hz // start*1e9 overflows after 2.9 years of uptime
	return (real.Nano() - (boot.Nano() - startNs)) / 1e6, true
}

// clockTicks returns the kernel's USER_HZ, the unit of starttime: 100 on
// every current architecture, told by the auxiliary vector.
var clockTicks = sync.OnceValue(func() int64 {
	const atClkTck = 17 // AT_CLKTCK
	if av, err := unix.Auxv(); err == nil {
		for _, kv := range av {
			if kv[0] == atClkTck && kv[1] > 0 {
				return int64(kv[1])
			}
		}
	}
	return 100
})

type stat struct {
	pid     int
	comm    string // field 2, without its parentheses
	state   byte   // field 3
	threads int    // field 20, num_threads
	start   int64  // field 22, starttime: clock ticks since boot
}

type statError struct{ Line, What string }

func (e *statError) Error() string {
	return fmt.Sprintf("owner: parse /proc stat line %q: %s", e.Line, e.What)
}

// parseStat parses a /proc/PID/stat line. The command name (field 2) is in
// parentheses and may hold any byte but NUL, spaces and ')' included, so
// the fields after it are found after the last ')' of the line: no later
// field contains one.
func parseStat(b []byte) (stat, error) {
	bad := func(what string) (stat, error) { return stat{}, &statError{Line: string(b), What: what} }
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 0 || closing < open {
		return bad("no command name in parentheses")
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil || pid <= 0 {
		return bad("field 1 is not a pid")
	}
	// fields[0] is field 3 (state), fields[17] field 20 (num_threads),
	// fields[19] field 22 (starttime).
	fields := strings.Fields(string(b[closing+1:]))
	if len(fields) < 20 {
		return bad(fmt.Sprintf("%d fields after the command name; want at least 20", len(fields)))
	}
	if len(fields[0]) != 1 {
		return bad(fmt.Sprintf("state (field 3) is %q; want one letter", fields[0]))
	}
	start, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil || start < 0 {
		return bad(fmt.Sprintf("starttime (field 22) is %q; want a count of clock ticks", fields[19]))
	}
	threads, err := strconv.Atoi(fields[17])
	if err != nil || threads < 0 {
		return bad(fmt.Sprintf("num_threads (field 20) is %q; want a count", fields[17]))
	}
	return stat{pid: pid, comm: string(b[open+1 : closing]), state: fields[0][0], threads: threads, start: start}, nil
}

func leaseClock() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("owner: read CLOCK_BOOTTIME: %w", err)
	}
	return ts.Nano(), nil
}

// leaseBoot is the boot id of process scopes.
func leaseBoot() string { return host.scope().boot }

const commLen = 15

// NameOf returns the name of process pid, for people to read, or "": its
// /proc/PID/comm, and where the kernel cut that to 15 bytes, the base name
// of the program in /proc/PID/cmdline that it starts with. Not gopsutil:
// its initialisation alone reads /proc/stat twice in every process that
// links it.
func NameOf(_ context.Context, pid int) string {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/comm")
	if err != nil {
		return ""
	}
	comm := string(bytes.TrimSuffix(b, []byte("\n")))
	if len(comm) < commLen {
		return comm
	}
	cmd, err := os.ReadFile(dir + "/cmdline")
	if err != nil {
		return comm
	}
	arg0, _, _ := bytes.Cut(cmd, []byte{0})
	if full := filepath.Base(string(arg0)); len(full) > len(comm) && full[:len(comm)] == comm {
		return full
	}
	return comm
}

func inspect(_ context.Context, pid int) (Process, error) { return host.inspect(pid) }

// inspect needs only the stat line: the rest is left out when it cannot be
// read (another user's process).
func (p *procFS) inspect(pid int) (Process, error) {
	dir := strconv.Itoa(pid)
	b, err := fs.ReadFile(p.fsys, dir+"/stat")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Process{}, fmt.Errorf("owner: pid %d: %w", pid, ErrNotRunning)
		}
		return Process{}, fmt.Errorf("owner: inspect pid %d: %w", pid, err)
	}
	st, err := parseStat(b)
	if err != nil {
		return Process{}, err
	}
	if st.pid != pid {
		return Process{}, fmt.Errorf("owner: /proc/%d/stat is of pid %d", pid, st.pid)
	}
	if st.state == 'Z' || st.state == 'X' {
		return Process{}, fmt.Errorf("owner: pid %d has exited: %w", pid, ErrNotRunning)
	}
	// parseStat has checked the line up to field 22; fields[1] is field 4
	// (ppid), fields[25] field 28 (startstack), fields[45] field 48
	// (arg_start, Linux 3.5 and later).
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ppid, err := strconv.Atoi(fields[1])
	if err != nil || ppid < 0 {
		return Process{}, &statError{Line: string(b), What: fmt.Sprintf("ppid (field 4) is %q; want a pid", fields[1])}
	}
	pr := Process{PID: pid, PPID: ppid, Name: st.comm}
	// The kernel shows 0 for both to a caller that may not trace pid.
	if len(fields) > 45 && fields[25] != "0" && fields[45] != "0" {
		pr.Layout = fields[25] + " " + fields[45]
	}
	if exe, err := fs.ReadLink(p.fsys, dir+"/exe"); err == nil {
		pr.Exe = exe
	}
	if cmd, err := fs.ReadFile(p.fsys, dir+"/cmdline"); err == nil && len(cmd) > 0 {
		pr.Args = strings.Split(string(bytes.TrimSuffix(cmd, []byte{0})), "\x00")
	}
	if in, err := fs.ReadLink(p.fsys, dir+"/fd/0"); err == nil {
		pr.Stdin = in
	}
	return pr, nil
}
