package owner

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
)

// commLen is the length at which the kernel cuts a process's comm.
const commLen = 15

// name returns the name of process pid, or "" when it cannot be read. A name
// is for people; its absence changes nothing.
//
// It is read from /proc/PID/comm, and where the kernel cut that to 15 bytes,
// the base name of the program in /proc/PID/cmdline that it starts with. On
// Linux berth reads /proc itself rather than through gopsutil, whose package
// initialisation alone reads /proc/stat twice in every process that links it.
func name(_ context.Context, pid int) string {
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
