// Package transient tells a passing shortage of the system's resources
// (file descriptors, memory, disk space) or an interrupted call from a
// fault: the first is a reason to fail the call and try again later, never
// to treat a store as broken or to fall back from it.
package transient

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrTransient is wrapped by every error that Wrap and its kind make: the
// call failed for want of something the system runs short of now and then,
// or it was interrupted. Nothing is damaged; the same call may work once
// the shortage has passed.
var ErrTransient = errors.New("a passing shortage, not damage")

// kind says what ran short, in words for a message, and what to do
// besides trying again.
type kind struct {
	errno syscall.Errno
	what  string
	fix   string // "" when waiting is all there is to do
}

// Errno returns the error number of the shortage err wraps, and whether
// there is one.
func Errno(err error) (syscall.Errno, bool) {
	k, ok := kindOf(err)
	return k.errno, ok
}

func kindOf(err error) (kind, bool) {
	var no syscall.Errno
	if errors.As(err, &no) {
		for _, k := range kinds {
			if k.errno == no {
				return k, true
			}
		}
	}
	return kind{}, false
}

// Is reports whether err is a shortage: it wraps ErrTransient, or one of
// the error numbers of a shortage.
func Is(err error) bool {
	if errors.Is(err, ErrTransient) {
		return true
	}
	_, ok := Errno(err)
	return ok
}

// IsDisk reports whether err is a shortage of disk space or quota.
func IsDisk(err error) bool {
	no, ok := Errno(err)
	return ok && (no == syscall.ENOSPC || no == diskQuota)
}

// Wrap returns err wrapped with ErrTransient and a sentence saying what
// ran short and what to do, when err wraps the error number of a
// shortage; otherwise nil.
func Wrap(err error) error {
	no, ok := Errno(err)
	if !ok {
		return nil
	}
	if no == syscall.EMFILE || no == syscall.ENFILE {
		markShort()
	}
	return As(no, err)
}

// As returns err wrapped with ErrTransient and the words for errno no,
// whether or not err carries no itself (SQLite reports a failed open
// without the open's errno, and the caller found the shortage another
// way).
func As(no syscall.Errno, err error) error {
	if errors.Is(err, ErrTransient) {
		return err
	}
	k, ok := kindOf(no)
	what, fix := k.what, k.fix
	if !ok {
		what = no.Error()
	}
	if fix == "" {
		return fmt.Errorf("%s (%w); try again: %w", what, ErrTransient, err)
	}
	return fmt.Errorf("%s (%w): %s, then try again: %w", what, ErrTransient, fix, err)
}

// lastShort is when this process last ran short of descriptors, as time
// since epoch (0: never): a monotonic reading, which a stepped clock leaves.
var (
	epoch     = time.Now().Add(-time.Nanosecond)
	lastShort atomic.Int64
)

func markShort() { lastShort.Store(int64(time.Since(epoch))) }

// headroom is how many descriptors DescriptorsShort asks for: about what
// opening a SQLite database in WAL mode takes (the file, its -wal and -shm,
// a journal, the directory) and a lock file or two beside it.
const headroom = 8

// DescriptorsShort reports whether this process is short of file
// descriptors now, or was within the last second (a shortage that ended as
// SQLite returned): it opens the null device up to headroom times. It
// returns the error of the open that failed with EMFILE or ENFILE, or nil.
// SQLite reports a database it could not open for want of a descriptor as
// SQLITE_CANTOPEN (or an I/O error) without the errno, having closed its
// own: several spare descriptors say that it did not run out.
func DescriptorsShort() error {
	if last := lastShort.Load(); last != 0 && time.Since(epoch)-time.Duration(last) < time.Second {
		return fmt.Errorf("%w %v ago", syscall.EMFILE, (time.Since(epoch) - time.Duration(last)).Round(time.Millisecond))
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	for range headroom {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if no, ok := Errno(err); ok && (no == syscall.EMFILE || no == syscall.ENFILE) {
				markShort()
				return err
			}
			return nil // something else: not a sign of a shortage
		}
		files = append(files, f)
	}
	return nil
}
