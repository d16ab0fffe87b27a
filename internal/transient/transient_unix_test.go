//go:build linux || darwin

package transient_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/transient"
)

// TestDescriptorsShort lowers this process's RLIMIT_NOFILE to just above
// the descriptors it has open, then restores it: the shortage still counts
// for a moment after (a failed open of SQLite may have met it, and its
// caller looks only once it returned), and then no more.
func TestDescriptorsShort(t *testing.T) {
	transient.ForgetShortage() // other tests wrap EMFILE
	if err := transient.DescriptorsShort(); err != nil {
		t.Fatalf("DescriptorsShort() with the usual limit = %v; want nil", err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull) // the lowest free number: the limit goes just above it
	if err != nil {
		t.Fatal(err)
	}
	next := f.Fd()
	_ = f.Close()
	low := lim
	low.Cur = uint64(next) + 2
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("skipping: cannot lower RLIMIT_NOFILE: %v", err)
	}
	err = transient.DescriptorsShort()
	if rerr := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); rerr != nil {
		t.Fatalf("restore RLIMIT_NOFILE: %v", rerr)
	}
	if no, ok := transient.Errno(err); !ok || no != syscall.EMFILE {
		t.Errorf("DescriptorsShort() with 2 descriptors to spare = %v; want EMFILE", err)
	}
	if err := transient.DescriptorsShort(); !errors.Is(err, syscall.EMFILE) {
		t.Errorf("DescriptorsShort() just after the limit was restored = %v; want EMFILE, met a moment ago", err)
	}
	time.Sleep(1100 * time.Millisecond)
	if err := transient.DescriptorsShort(); err != nil {
		t.Errorf("DescriptorsShort() a second after the limit was restored = %v; want nil", err)
	}
	// A shortage another call met (Wrap saw its EMFILE) counts the same way.
	_ = transient.Wrap(&os.PathError{Op: "open", Path: "/x", Err: syscall.EMFILE})
	if err := transient.DescriptorsShort(); !errors.Is(err, syscall.EMFILE) {
		t.Errorf("DescriptorsShort() just after Wrap met EMFILE = %v; want EMFILE", err)
	}
}

func TestWrap(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string // in the message; "" for an error that is no shortage
		disk bool
	}{
		{syscall.EMFILE, "too many open files", false},
		{&os.PathError{Op: "open", Path: "/x", Err: syscall.EMFILE}, "this process has used up its file descriptors", false},
		{os.NewSyscallError("socket", syscall.ENFILE), "the host has used up its file descriptors", false},
		{fmt.Errorf("read: %w", syscall.ENOMEM), "out of memory", false},
		{syscall.ENOBUFS, "out of buffer space", false},
		{&os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, "no space left on the device", true},
		{syscall.EDQUOT, "disk quota exceeded", true},
		{syscall.EINTR, "interrupted", false},
		{syscall.EAGAIN, "temporarily unavailable", false},
		{syscall.EACCES, "", false},
		{&os.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, "", false},
		{syscall.EADDRINUSE, "", false},
		{syscall.EISDIR, "", false},
		{errors.New("unable to open database file (14)"), "", false},
	} {
		got := transient.Wrap(c.err)
		switch {
		case c.want == "" && got != nil:
			t.Errorf("Wrap(%v) = %v; want nil: not a shortage", c.err, got)
		case c.want == "":
			if transient.Is(c.err) {
				t.Errorf("Is(%v) = true; want false", c.err)
			}
		case got == nil:
			t.Errorf("Wrap(%v) = nil; want an error saying %q", c.err, c.want)
		case !errors.Is(got, transient.ErrTransient) || !errors.Is(got, c.err) || !strings.Contains(got.Error(), c.want):
			t.Errorf("Wrap(%v) = %v; want it to wrap ErrTransient and the cause, saying %q", c.err, got, c.want)
		case !transient.Is(c.err) || !transient.Is(got):
			t.Errorf("Is(%v) = false; want true", c.err)
		case transient.IsDisk(c.err) != c.disk:
			t.Errorf("IsDisk(%v) = %v; want %v", c.err, !c.disk, c.disk)
		case transient.Wrap(got).Error() != got.Error() || transient.As(syscall.EMFILE, got).Error() != got.Error():
			t.Errorf("wrapping %v again changed it", got)
		}
	}
}

// TestDiskFull mounts a small tmpfs (as root), fills it, and checks that
// DiskFull tells a full file system from one with room.
func TestDiskFull(t *testing.T) {
	dir := t.TempDir()
	if err := transient.DiskFull(dir); err != nil {
		t.Errorf("DiskFull(%s) = %v; want nil: it has room", dir, err)
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: mounting a tmpfs needs root")
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("skipping: cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	if err := transient.DiskFull(dir); err != nil {
		t.Errorf("DiskFull of an empty tmpfs = %v; want nil", err)
	}
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	var werr error
	for werr == nil {
		_, werr = f.Write(chunk)
	}
	_ = f.Close()
	if !transient.IsDisk(werr) {
		t.Fatalf("filling the tmpfs ended with %v; want ENOSPC", werr)
	}
	err = transient.DiskFull(dir)
	if !errors.Is(err, syscall.ENOSPC) || !transient.IsDisk(err) {
		t.Errorf("DiskFull of a full tmpfs = %v; want ENOSPC", err)
	}
}
