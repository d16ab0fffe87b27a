package portalloc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
)

func init() {
	// logged allocates one port with the Config of the environment.
	workers["logged"] = func(ctx context.Context) error {
		cfg, err := portalloc.ConfigFromEnv()
		if err != nil {
			return err
		}
		a, err := portalloc.New(ctx, cfg)
		if err != nil {
			return err
		}
		defer a.Close()
		_, err = a.Allocate(ctx, portalloc.Request{Label: "logged"})
		return err
	}
}

// TestBerthLog: BERTH_LOG turns on an slog text log on standard error at
// the level it names; a value it does not know is an error naming it.
func TestBerthLog(t *testing.T) {
	for _, tc := range []struct {
		level     string
		reserved  bool // the per-port line appears
		wantError bool
	}{
		{"debug", true, false},
		{"info", false, false},
		{"warn", false, false},
		{"loud", false, true},
	} {
		cmd := testproc.Command(t, "logged")
		cmd.Env = append(cmd.Env,
			portalloc.EnvLog+"="+tc.level,
			portalloc.EnvStateDir+"="+t.TempDir(),
			portalloc.EnvMode+"=statestore",
			portalloc.EnvPortRange+"="+allocRange.String())
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if tc.wantError {
			if err == nil || !strings.Contains(string(out), `BERTH_LOG "loud": want "debug", "info" or "warn"`) {
				t.Errorf("BERTH_LOG=%s: %v, output %q", tc.level, err, out)
			}
			continue
		}
		if err != nil {
			t.Fatalf("BERTH_LOG=%s: %v: %s%s", tc.level, err, out, stderr.String())
		}
		line := strings.Contains(stderr.String(), `level=DEBUG msg="reserved port"`) && strings.Contains(stderr.String(), "label=logged")
		if line != tc.reserved {
			t.Errorf("BERTH_LOG=%s: per-port line logged = %v; want %v; stderr:\n%s", tc.level, line, tc.reserved, stderr.String())
		}
	}
	t.Setenv(portalloc.EnvLog, "trace")
	if _, err := portalloc.ConfigFromEnv(); !errors.Is(err, portalloc.ErrInvalidRequest) {
		t.Errorf("ConfigFromEnv with BERTH_LOG=trace = %v; want ErrInvalidRequest", err)
	}
}
