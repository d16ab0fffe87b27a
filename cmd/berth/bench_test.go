package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testports"
)

// BenchmarkGet runs `berth get` end to end, as a script does: a fresh
// process that opens the store, allocates a port for its parent, prints it
// and exits; the store exists already. empty-program is the same start and
// exit of a Go program that does nothing, built the same way: what any
// command written in Go costs. The port is released between iterations,
// outside the timing. Both are built as the README installs berth, with
// CGO_ENABLED=0: a static binary, which starts without the dynamic loader
// and the C library's set-up.
func BenchmarkGet(b *testing.B) {
	testports.Hold(b, testports.CmdBerth)
	dir := b.TempDir()
	berth := filepath.Join(dir, "berth")
	build(b, ".", berth)
	empty := filepath.Join(dir, "empty")
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	writeFile(b, filepath.Join(src, "go.mod"), "module empty\n\ngo 1.26\n")
	writeFile(b, filepath.Join(src, "main.go"), "package main\n\nfunc main() {}\n")
	build(b, src, empty)

	env := append(os.Environ(),
		"BERTH_STATE_DIR="+filepath.Join(dir, "state"),
		"BERTH_PORT_RANGE="+testports.CmdBerth.String(),
	)
	runOut := func(b *testing.B, name string, args ...string) string {
		b.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.Bytes())
		}
		return strings.TrimSpace(string(out))
	}
	runOut(b, berth, "ls") // creates the store

	b.Run("berth-get", func(b *testing.B) {
		for b.Loop() {
			port := runOut(b, berth, "get")
			b.StopTimer()
			runOut(b, berth, "release", port)
			b.StartTimer()
		}
	})
	b.Run("empty-program", func(b *testing.B) {
		for b.Loop() {
			runOut(b, empty)
		}
	})
}

func build(b *testing.B, dir, out string) {
	b.Helper()
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", dir, err, msg)
	}
}

func writeFile(b *testing.B, path, content string) {
	b.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		b.Fatal(fmt.Errorf("write %s: %w", path, err))
	}
}
