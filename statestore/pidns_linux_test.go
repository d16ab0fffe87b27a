package statestore_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// livePidNS returns the inode of a pid namespace other than this process's
// that has a process until the test ends: a child's own namespace where one
// can be made (root), else a made-up one, which a process that is not root
// cannot tell from a live one.
func livePidNS(tb testing.TB) string {
	tb.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		return "1"
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	l, err := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/pid")
	if err != nil {
		return "1"
	}
	_, l, _ = strings.Cut(l, "[")
	return strings.TrimSuffix(l, "]")
}
