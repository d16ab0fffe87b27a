package filelock_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/filelock"
	"github.com/berth-go/berth/internal/testproc"
)

// The test binary doubles as a lock-holding child: in the role "hold" it
// takes the lock at BERTH_FILELOCK_PATH, prints "locked", and holds it
// until stdin closes.
func init() {
	testproc.Register("hold", func() int {
		l, err := filelock.Open(os.Getenv("BERTH_FILELOCK_PATH"))
		if err != nil {
			return 1
		}
		if err := l.Lock(); err != nil {
			return 1
		}
		os.Stdout.WriteString("locked\n")
		_, _ = os.Stdin.Read(make([]byte, 1))
		return 0
	})
}

func TestMain(m *testing.M) {
	testproc.MaybeRun()
	os.Exit(m.Run())
}

func TestAcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	cmd := testproc.Command(t, "hold")
	cmd.Env = append(cmd.Env, "BERTH_FILELOCK_PATH="+path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	buf := make([]byte, 7)
	if _, err := stdout.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("child said %q, %v", buf, err)
	}

	l, err := filelock.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if ok, err := l.TryLock(); ok || err != nil {
		t.Fatalf("TryLock while the child holds it = %v, %v; want false, nil", ok, err)
	}
	got := make(chan error, 1)
	go func() { got <- l.Lock() }()
	select {
	case err := <-got:
		t.Fatalf("Lock returned %v while the child holds the lock", err)
	case <-time.After(50 * time.Millisecond):
	}
	_ = stdin.Close() // the child exits and the kernel hands us the lock
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lock did not return after the holder exited")
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.TryLock(); !ok || err != nil {
		t.Errorf("TryLock after Unlock = %v, %v; want true", ok, err)
	}
}
