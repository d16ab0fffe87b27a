//go:build unix

package main

import (
	"context"
	"io/fs"
	"path/filepath"
	"time"
)

// Backoff between restarts of a command that keeps exiting: it starts at
// firstBackoff, doubles with each exit that comes sooner than steadyRun
// after the start, up to maxBackoff, and starts over once the command has
// run for steadyRun.
const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 10 * time.Second
	steadyRun    = 10 * time.Second
)

// stopGrace is how long berth run waits for COMMAND to exit after SIGTERM,
// on a change of a watched path, before it sends SIGKILL.
const stopGrace = 5 * time.Second

// Watching: how often the watched paths are looked at, and how long they
// must stay unchanged after a change before COMMAND is restarted (an
// editor's save, a build's output, come as bursts of writes).
const (
	watchPoll     = 200 * time.Millisecond
	watchDebounce = 300 * time.Millisecond
)

// fileState is what berth run compares of a watched file.
type fileState struct {
	size    int64
	modTime time.Time
	mode    fs.FileMode
}

// snapshot returns the state of every file under paths. Directories are
// walked, leaving out .git and node_modules below them; what cannot be
// read is left out.
func snapshot(paths []string) map[string]fileState {
	out := map[string]fileState{}
	for _, root := range paths {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && p != root && (d.Name() == ".git" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			if info, err := d.Info(); err == nil {
				out[p] = fileState{info.Size(), info.ModTime(), info.Mode()}
			}
			return nil
		})
	}
	return out
}

func sameSnapshot(a, b map[string]fileState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !w.modTime.Equal(v.modTime) || w.size != v.size || w.mode != v.mode {
			return false
		}
	}
	return true
}

// watch sends on changed, without blocking, each time the files under
// paths change and then stay unchanged for watchDebounce, until ctx ends.
// It looks every watchPoll: that works on every system and file system
// (network mounts, containers' bind mounts) at the cost of a walk of the
// tree each time.
func watch(ctx context.Context, paths []string, changed chan<- struct{}) {
	last := snapshot(paths)
	var changedAt time.Time // of a change not yet reported
	t := time.NewTicker(watchPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := snapshot(paths)
		if !sameSnapshot(last, now) {
			last, changedAt = now, time.Now()
			continue
		}
		if !changedAt.IsZero() && time.Since(changedAt) >= watchDebounce {
			changedAt = time.Time{}
			select {
			case changed <- struct{}{}:
			default: // one is pending already
			}
		}
	}
}
