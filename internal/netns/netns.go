// Package netns makes Linux network namespaces stand in for the hosts of a
// fleet, for berth's tests and its torture harness.
//
// Each namespace has a loopback interface and port space of its own, so a
// port bound in one is free in every other, as on separate machines, while
// the file system, the process table and a PostgreSQL server's unix socket
// stay shared. A namespace is made with "ip netns add" and its loopback
// brought up with "ip -n NAME link set lo up"; a program runs inside it
// through "ip netns exec NAME", which switches namespace and then execs the
// program, so the process started is the program itself, with its own pid.
// Making namespaces needs root (CAP_SYS_ADMIN) and Linux: elsewhere every
// call fails with ErrUnsupported.
package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// ErrUnsupported is returned where network namespaces cannot be made: not
// Linux, not root, or no usable ip command.
var ErrUnsupported = errors.New("netns: network namespaces need Linux, root and iproute2's ip")

// NS is a network namespace made by Add. Its zero value is not usable.
type NS struct {
	// Name is the namespace's name under /run/netns.
	Name string
}

// Command returns the command that runs name with args inside ns, with the
// caller's environment: a Cmd for "ip netns exec NS.Name name args...".
// Once started, its Process is the program itself.
func (ns NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command(ipPath(), append([]string{"netns", "exec", ns.Name, name}, args...)...)
}

// AddN makes n namespaces named prefix-1 through prefix-n, each with its
// loopback up, and returns them with the function that deletes them all.
// On an error it deletes those it made. The remove function deletes every
// namespace even when some fail, and returns the errors joined; a
// namespace whose maker was SIGKILLed is left behind, for
// "ip netns delete NAME".
func AddN(ctx context.Context, prefix string, n int) (nss []NS, remove func() error, err error) {
	remove = func() error {
		var errs []error
		for _, ns := range nss {
			errs = append(errs, del(ctx, ns.Name))
		}
		return errors.Join(errs...)
	}
	for i := 1; i <= n; i++ {
		ns, err := Add(ctx, fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			return nil, nil, errors.Join(err, remove())
		}
		nss = append(nss, ns)
	}
	return nss, remove, nil
}

// ForTest makes n namespaces for tb as AddN does, with names of this
// process's own (the test binaries of one go test ./... never meet), and
// deletes them when the test ends, failed or not. It skips the test,
// saying why, when namespaces cannot be made here.
func ForTest(tb testing.TB, n int) []NS {
	tb.Helper()
	nss, remove, err := AddN(context.Background(), fmt.Sprintf("berth-test-%d", os.Getpid()), n)
	if errors.Is(err, ErrUnsupported) {
		tb.Skipf("%v (run the test as root on Linux)", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := remove(); err != nil {
			tb.Errorf("delete network namespaces: %v", err)
		}
	})
	return nss
}

// del deletes the namespace name, even when ctx has ended: what was made
// is cleaned up.
func del(ctx context.Context, name string) error {
	if err := runIP(context.WithoutCancel(ctx), "netns", "delete", name); err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	return nil
}

// runIP runs ip with args and returns its combined output in the error.
func runIP(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, ipPath(), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
