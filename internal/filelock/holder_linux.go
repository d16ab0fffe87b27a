package filelock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// HolderOf returns the process that holds the lock on the file at path,
// where the OS can tell; ok is false when it cannot. It finds the FLOCK
// entry of path's inode in /proc/locks. A line there reads, for a granted
// lock:
//
//	1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF
//
// and for a waiter the same with "->" after the number, which is skipped.
//
// /proc/locks is made in pieces, each resuming at a line number, so a lock
// taken or let go elsewhere between two pieces shifts the lines and can
// make one skipped: under a busy machine's flock traffic the holder was
// missed now and then. It is read in reads as large as the kernel makes
// its pieces, and again a few times before giving up.
func HolderOf(path string) (Holder, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Holder{}, false
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for range 4 {
		if h, ok := findHolder(want); ok {
			return h, true
		}
	}
	return Holder{}, false
}

// findHolder reads /proc/locks once for the holder of the inode want
// names.
func findHolder(want string) (Holder, bool) {
	data, err := readAll("/proc/locks")
	if err != nil {
		return Holder{}, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] == "->" || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil || pid <= 0 {
			continue
		}
		h := Holder{PID: pid}
		h.Name, h.Stopped = procState(pid)
		return h, true
	}
	return Holder{}, false
}

// readAll reads a file of /proc with 64 KiB reads. os.ReadFile starts
// with 512 bytes for a file whose size is 0, and every read of a
// generated file is a piece of its own.
func readAll(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// procState reads the command name and whether pid is stopped from
// /proc/PID/stat. The name is in parentheses and may itself hold spaces and
// parentheses, so the state is the field after the last ')'.
func procState(pid int) (name string, stopped bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open || end+2 >= len(b) {
		return "", false
	}
	state := b[end+2]
	return string(b[open+1 : end]), state == 'T' || state == 't'
}
