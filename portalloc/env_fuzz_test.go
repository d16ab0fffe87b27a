package portalloc

import (
	"errors"
	"testing"
)

// FuzzConfigFromEnv feeds arbitrary values to every BERTH_* variable: the
// parser must never panic, must reject with ErrInvalidRequest naming a
// variable, and what it accepts must pass New's validation or be rejected
// there with ErrInvalidRequest too.
func FuzzConfigFromEnv(f *testing.F) {
	f.Add("statestore", "20000-32767", "22000-22100,25565", "/tmp/berth", "10s", "true")
	f.Add("mru", "1-65535", "", "", "1ns", "false")
	f.Add("fast", "0-10", ",", "\x00", "-1s", "maybe")
	f.Fuzz(func(t *testing.T, mode, rng, exclude, dir, timeout, overlap string) {
		env := map[string]string{
			EnvMode: mode, EnvPortRange: rng, EnvPortExclude: exclude,
			EnvStateDir: dir, EnvTimeout: timeout, EnvAllowEphemeralOverlap: overlap,
		}
		c, err := configFromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("error %v does not wrap ErrInvalidRequest", err)
			}
			return
		}
		if c.StateDir == "" {
			c.StateDir = "/nonexistent"
		}
		if _, err := c.withDefaults(); err != nil && !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("withDefaults(%+v) = %v; want nil or ErrInvalidRequest", c, err)
		}
	})
}
