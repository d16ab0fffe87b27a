//go:build linux

package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// TestSquatter: a program that is not berth binds names of a port's locks
// (anyone may). It denies what each name stands for, and berth says who
// holds it; it never makes berth grant a port twice, and it denies nothing
// else. (A name of an address alone is no lock of berth's, which holds a
// slot beside it: it does not deny the port's wildcard.)
func TestSquatter(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 3)
	a := newAllocator(t, portalloc.Config{Range: store.Range{First: base, Last: base + 2}, AllowEphemeralOverlap: true})
	squat := func(t *testing.T, port uint16, tag string) {
		t.Helper()
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Close(fd) })
		if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: fmt.Sprintf("@berth/1/tcp/%d/%s", port, tag)}); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(t *testing.T, addr string, port uint16) {
		t.Helper()
		r, err := a.Reserve(ctx, portalloc.Request{Addr: mustAddr(addr)}, port)
		var ce *store.ConflictError
		if !errors.As(err, &ce) || !slices.Contains(ce.PIDs, os.Getpid()) || !strings.Contains(err.Error(), "locked by pid "+strconv.Itoa(os.Getpid())) {
			t.Errorf("Reserve(%s:%d) of a squatted port = %v, %v; want a conflict naming the squatter, pid %d", addr, port, r, err, os.Getpid())
		}
	}
	t.Run("address", func(t *testing.T) {
		squat(t, base, "127.0.0.1")
		refused(t, "127.0.0.1", base)
		// Another address of the port is not squatted.
		r, err := a.Reserve(ctx, portalloc.Request{Addr: mustAddr("127.0.0.2")}, base)
		if err != nil {
			t.Fatalf("Reserve(127.0.0.2:%d) beside a squatted 127.0.0.1 = %v; want it granted", base, err)
		}
		_ = a.Release(ctx, r)
		// Allocate passes the squatted port over.
		for range 3 {
			r, err := a.Allocate(ctx, portalloc.Request{Addr: lo4})
			if err != nil || r.Port == base {
				t.Fatalf("Allocate with %d squatted = %v, %v; want another port", base, r, err)
			}
			_ = a.Release(ctx, r)
		}
	})
	t.Run("wildcard", func(t *testing.T) {
		squat(t, base+1, "*")
		refused(t, "127.0.0.1", base+1)
		refused(t, "::1", base+1)
		refused(t, "::", base+1)
	})
	t.Run("slots", func(t *testing.T) {
		squat(t, base+2, "s0")
		refused(t, "0.0.0.0", base+2)
		r, err := a.Reserve(ctx, portalloc.Request{Addr: lo4}, base+2)
		if err != nil {
			t.Fatalf("Reserve(127.0.0.1:%d) with one slot squatted = %v; want it granted (other slots are free)", base+2, err)
		}
		_ = a.Release(ctx, r)
	})
}

// otherUser creates a real user for the test (root only; skipped
// otherwise) and deletes it when the test ends.
func otherUser(t *testing.T) *user.User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a berth process as a second user")
	}
	useradd, err := exec.LookPath("useradd")
	if err != nil {
		t.Skip("needs useradd to create a second user")
	}
	name := fmt.Sprintf("berth%d", time.Now().UnixNano()%1e8)
	if out, err := exec.Command(useradd, "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Skipf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
			t.Errorf("userdel --remove %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestAnotherUser: two users' berths keep separate stores (each its own
// state directory, which the other may not read), yet neither is granted a
// port the other holds reserved, bound or not; berth names the other
// user's process where it may see it (root may).
func TestAnotherUser(t *testing.T) {
	u := otherUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// The other user runs a copy of this test binary it may execute.
	bin := filepath.Join(u.HomeDir, "portalloc.test")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(u.HomeDir, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}

	port := freeRun(t, 2)
	cmd := spawnAs(t, bin, uid, gid, "hold", "BERTH_STATE_DIR="+dir, "BERTH_TEST_ADDR=127.0.0.1", "BERTH_TEST_PORT="+strconv.Itoa(int(port)))
	cmd.ready(t)

	// Root's own store: the other user's row is not in it.
	ctx := context.Background()
	a := newAllocator(t, portalloc.Config{Range: store.Range{First: port, Last: port + 1}, AllowEphemeralOverlap: true})
	_, err = a.Reserve(ctx, portalloc.Request{Addr: lo4}, port)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !slices.Contains(ce.PIDs, cmd.cmd.Process.Pid) {
		t.Fatalf("Reserve(%d) held by another user's berth = %v; want a conflict naming its pid %d", port, err, cmd.cmd.Process.Pid)
	}
	for range 5 {
		r, err := a.Allocate(ctx, portalloc.Request{Addr: lo4})
		if err != nil || r.Port == port {
			t.Fatalf("Allocate beside another user's reservation = %v, %v; want %d", r, err, port+1)
		}
		// And the other way round: the other user's berth is refused
		// root's port.
		other := spawnAs(t, bin, uid, gid, "hold", "BERTH_STATE_DIR="+dir, "BERTH_TEST_ADDR=0.0.0.0", "BERTH_TEST_PORT="+strconv.Itoa(int(r.Port)))
		line, _ := other.out.ReadString('\n')
		if !strings.Contains(line, "error:") || !strings.Contains(line, "locked by") {
			t.Fatalf("another user's Reserve(0.0.0.0:%d) held by root = %q; want a refusal, the port locked", r.Port, line)
		}
		_ = other.cmd.Wait()
		if err := a.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

// spawnAs starts bin (a copy of this test binary) as uid:gid in a worker
// mode, with env.
func spawnAs(t *testing.T, bin string, uid, gid int, mode string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append([]string{testproc.EnvRole + "=" + mode, "HOME=/nonexistent", "PATH=" + os.Getenv("PATH")}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	cmd.Stderr = io.Discard
	return start(t, cmd)
}
