package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
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

// del deletes the namespace name, even when ctx has ended: what was made
// is cleaned up.
func del(ctx context.Context, name string) error {
	if err := runIP(context.WithoutCancel(ctx), "netns", "delete", name); err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	return nil
}

// prefixForTest names a test's namespaces after this process, so that the
// test binaries of one go test ./... run never meet.
func prefixForTest() string { return fmt.Sprintf("berth-test-%d", os.Getpid()) }
