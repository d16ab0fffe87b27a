package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ipPath finds ip once: root's PATH has /usr/sbin, a test's may not.
var ipPath = sync.OnceValue(func() string {
	if p, err := exec.LookPath("ip"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "ip"
})

// Add makes the network namespace name and brings its loopback up. It
// fails with an error wrapping ErrUnsupported when this is not root or
// ip cannot make namespaces; on any error no namespace is left behind.
func Add(ctx context.Context, name string) (NS, error) {
	if os.Geteuid() != 0 {
		return NS{}, fmt.Errorf("%w: not root (euid %d)", ErrUnsupported, os.Geteuid())
	}
	if err := runIP(ctx, "netns", "add", name); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return NS{}, fmt.Errorf("%w: %w", ErrUnsupported, err)
		}
		if _, serr := os.Stat("/run/netns/" + name); serr == nil {
			// It exists already: not ours to use or to delete.
			return NS{}, fmt.Errorf("netns: add %s: %w", name, err)
		}
		return NS{}, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	if err := runIP(ctx, "-n", name, "link", "set", "lo", "up"); err != nil {
		return NS{}, errors.Join(fmt.Errorf("netns: %s: %w", name, err), del(ctx, name))
	}
	return NS{Name: name}, nil
}

// Do runs f on an OS thread of this process switched into ns, and
// switches the thread back before it returns. A socket f opens stays in
// ns: this is how one process binds a port in the namespaces of several
// hosts. The process itself, its other threads and what /proc/PID/ns/net
// shows stay where they were.
func (ns NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The goroutine never unlocks its thread when it could not switch
		// it back: the runtime then ends the thread with the goroutine.
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: %w", err)
			return
		}
		defer func() { _ = orig.Close() }()
		target, err := os.Open("/run/netns/" + ns.Name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: %w", err)
			return
		}
		defer func() { _ = target.Close() }()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: enter %s: %w", ns.Name, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("netns: leave %s: %w", ns.Name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Pids returns the processes whose network namespace is ns (as "ip netns
// pids" lists them): the programs started in it and their children.
func (ns NS) Pids(ctx context.Context) ([]int, error) {
	out, err := exec.CommandContext(ctx, ipPath(), "netns", "pids", ns.Name).Output()
	if err != nil {
		return nil, fmt.Errorf("netns: ip netns pids %s: %w", ns.Name, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("netns: ip netns pids %s: %q is no pid", ns.Name, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// KillAll SIGKILLs every process in ns that keep does not report, and
// again those that appear meanwhile (children of the killed), until none
// is left or ctx ends; it returns how many it signalled. Each process is
// signalled through a pidfd after checking, on that pidfd's process, that
// it is still in ns: a pid reused meanwhile by a process elsewhere is
// never signalled. KillAll returns once every process it signalled has
// exited entirely, its sockets closed: a process leaves the namespace's
// list while it exits, before its last thread has closed its files.
func (ns NS) KillAll(ctx context.Context, keep func(pid int) bool) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat("/run/netns/"+ns.Name, &st); err != nil {
		return 0, fmt.Errorf("netns: %s: %w", ns.Name, err)
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	var dying []int // pidfds of the processes signalled
	defer func() {
		for _, fd := range dying {
			_ = unix.Close(fd)
		}
	}()
	for {
		pids, err := ns.Pids(ctx)
		if err != nil {
			return len(dying), err
		}
		pids = slices.DeleteFunc(pids, func(pid int) bool { return keep != nil && keep(pid) })
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // gone already
			}
			if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && link == want &&
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
				dying = append(dying, fd)
				continue
			}
			_ = unix.Close(fd)
		}
		select { // a little time for them to die
		case <-ctx.Done():
			return len(dying), fmt.Errorf("netns: kill the processes of %s: %w", ns.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	// A pidfd turns readable once its process has exited, every thread.
	for _, fd := range dying {
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 10)
			if err != nil && !errors.Is(err, unix.EINTR) {
				return len(dying), fmt.Errorf("netns: wait for the processes of %s: %w", ns.Name, err)
			}
			if n > 0 {
				break
			}
			if err := ctx.Err(); err != nil {
				return len(dying), fmt.Errorf("netns: wait for the processes of %s: %w", ns.Name, err)
			}
		}
	}
	return len(dying), nil
}
