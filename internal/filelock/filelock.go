// Package filelock holds an exclusive advisory lock on a file that stays
// open between locks.
//
// github.com/gofrs/flock opens the file on every Lock and closes it on every
// Unlock; that is right for rare locks and too slow for one around every
// write transaction. A File keeps one descriptor for its life.
//
// Never use it on a SQLite database file itself: closing any descriptor of
// that file drops SQLite's POSIX locks for the whole process. Lock a sidecar
// file instead.
package filelock

import (
	"fmt"
	"os"
)

// File is an open lock file. It is not safe for concurrent use: callers
// serialise Lock, TryLock and Unlock themselves.
type File struct {
	f *os.File
}

// Open opens (creating with mode 0600 if needed) the lock file at path.
func Open(path string) (*File, error) {
	// Never through a symbolic link: the lock file is berth's own.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|noFollow, 0o600)
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	return &File{f: f}, nil
}

// Path returns the lock file's path.
func (l *File) Path() string { return l.f.Name() }

// TryLock takes the lock if no other holder has it and reports whether it did.
func (l *File) TryLock() (bool, error) { return tryLock(l.f) }

// Lock waits until it holds the lock. The kernel wakes it as soon as the
// holder lets go; it cannot be interrupted, so callers that must honour a
// context wait for it in a goroutine.
func (l *File) Lock() error { return lock(l.f) }

// Unlock releases the lock.
func (l *File) Unlock() error { return unlock(l.f) }

// Close closes the file, releasing the lock if held.
func (l *File) Close() error { return l.f.Close() }

// Reopen opens the same lock file again, as a File of its own. Locks are
// held per open file, so the two compete for the lock like two processes:
// a waiter that may have to be abandoned blocks on a File of its own, and
// nothing it does later can touch the lock of the File it came from.
func (l *File) Reopen() (*File, error) { return Open(l.f.Name()) }

// Holder describes the process that holds a lock, as far as the OS tells.
type Holder struct {
	PID     int
	Name    string // the process's command name, "" if unknown
	Stopped bool   // stopped by a signal (SIGSTOP, Ctrl-Z) or a debugger
}

func (h Holder) String() string {
	s := fmt.Sprintf("pid %d", h.PID)
	if h.Name != "" {
		s += " (" + h.Name + ")"
	}
	if h.Stopped {
		s += ", which is stopped (SIGSTOP, Ctrl-Z or a debugger): continue it (kill -CONT) or end it"
	}
	return s
}
