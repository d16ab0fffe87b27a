package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestRun runs the orchestrator from a built binary (its services are the
// same binary) and checks the wiring and that nothing is left behind.
func TestRun(t *testing.T) {
	testports.Hold(t, testports.Orchestrator)
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "orchestrator")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "BERTH_STATE_DIR="+dir, "BERTH_MODE=statestore",
		"BERTH_PORT_RANGE="+testports.Orchestrator.String()) // not the default: other packages' tests bind there
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("orchestrator: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, re := range []string{
		`(?m)^SERVICE +PORT +PID +ENVIRONMENT$`,
		`(?m)^api +(\d+) +\d+ +API_HTTP_PORT=(\d+)$`,
		`(?m)^auth +(\d+) +\d+ +AUTH_HTTP_PORT=(\d+)$`,
		`(?m)^web +\d+ +\d+ +WEB_HTTP_PORT=\d+ API_ADDR_PORT=\d+ AUTH_ADDR_PORT=\d+$`,
		`(?m)^web answered: web on :\d+ reached api on :\d+ says "api ok" and auth on :\d+ says "auth ok"$`,
		`(?m)^stopped 3 services; reaped 3 reservations$`,
	} {
		if !regexp.MustCompile(re).MatchString(got) {
			t.Errorf("output lacks %s:\n%s", re, got)
		}
	}
	// web's references are api's and auth's real ports.
	api := regexp.MustCompile(`(?m)^api +(\d+)`).FindStringSubmatch(got)
	auth := regexp.MustCompile(`(?m)^auth +(\d+)`).FindStringSubmatch(got)
	if api == nil || auth == nil || !regexp.MustCompile(`API_ADDR_PORT=`+api[1]+` AUTH_ADDR_PORT=`+auth[1]).MatchString(got) {
		t.Errorf("web's refs do not match api's and auth's ports:\n%s", got)
	}
	for _, m := range regexp.MustCompile(`(?m)^(?:api|auth|web) +(\d+) `).FindAllStringSubmatch(got, -1) {
		if p, _ := strconv.Atoi(m[1]); !testports.Orchestrator.Contains(uint16(p)) {
			t.Errorf("port %d; want one in %v, from BERTH_PORT_RANGE", p, testports.Orchestrator)
		}
	}
	s, err := statestore.Open(context.Background(), filepath.Join(dir, "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rows, err := s.List(context.Background(), store.Filter{}); err != nil || len(rows) != 0 {
		t.Errorf("rows left: %v, %v", rows, err)
	}
}
