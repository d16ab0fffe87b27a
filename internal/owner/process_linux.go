package owner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

func inspect(_ context.Context, pid int) (Process, error) { return host.inspect(pid) }

// inspect reads pid's stat line, executable, command line and standard
// input from the /proc of p. Only the stat line is needed: the others are
// left out when they cannot be read (another user's process).
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
