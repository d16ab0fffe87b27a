package mru_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/internal/testproc"
)

// In the role "starved" the test binary leaves itself BERTH_TEST_SPARE
// file descriptors (RLIMIT_NOFILE just above those it has open), allocates
// port 20001 from the MRU file BERTH_MRU_PATH, and prints "port N", or
// "error transient=BOOL logged=BOOL: MESSAGE".
func init() {
	testproc.Register("starved", func() int {
		spare, err := strconv.Atoi(os.Getenv("BERTH_TEST_SPARE"))
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		logged := false
		f := mru.New(os.Getenv("BERTH_MRU_PATH"), mru.Options{Logger: funcr.New(func(_, _ string) { logged = true }, funcr.Options{})})
		if err := testproc.LeaveSpareFDs(spare); err != nil {
			fmt.Println("error:", err)
			return 1
		}
		once := false
		port, err := f.Allocate(context.Background(), mru.Request{
			Protocol: "tcp",
			Next: func() (uint16, bool) {
				if once {
					return 0, false
				}
				once = true
				return 20001, true
			},
			Probe: func(uint16) (bool, error) { return true, nil },
		})
		if err != nil {
			fmt.Printf("error transient=%v logged=%v: %v\n", errors.Is(err, mru.ErrTransient), logged, err)
			return 0
		}
		fmt.Println("port", port)
		return 0
	})
}

// TestAllocateOutOfDescriptors: an MRU file that cannot be opened for want
// of descriptors is no "read-only or full directory" to go on without: the
// call fails with an error wrapping ErrTransient that names the cause, and
// logs nothing about recording.
func TestAllocateOutOfDescriptors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mru.json")
	failed, served := 0, 0
	for spare := range 5 {
		cmd := testproc.Command(t, "starved")
		cmd.Env = append(cmd.Env, "BERTH_MRU_PATH="+path, "BERTH_TEST_SPARE="+strconv.Itoa(spare),
			"GORACE=atexit_sleep_ms=0") // under -race a worker would sleep a second as it exits
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("worker with %d spare descriptors: %v: %s", spare, err, out)
		}
		line := strings.TrimSpace(string(out))
		switch {
		case line == "port 20001":
			served++
			// The next run starts afresh: a recent port is skipped.
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		case strings.HasPrefix(line, "error transient=true logged=false: ") && strings.Contains(line, "too many open files"):
			failed++
		default:
			t.Errorf("Allocate with %d spare descriptors: %s; want port 20001 or an error wrapping ErrTransient saying too many files are open", spare, line)
		}
		if spare == 0 && line == "port 20001" {
			t.Errorf("Allocate with no spare descriptor handed out a port it could not record")
		}
	}
	if failed == 0 || served == 0 {
		t.Errorf("%d runs failed and %d served; want both", failed, served)
	}
}
