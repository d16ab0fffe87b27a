package portalloc

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berth-go/berth/store"
)

// FuzzConfigFromEnv feeds arbitrary values to BERTH_* variables: the
// parser never panics, refuses with a *store.FieldError naming a variable
// for each one it refuses, quotes nothing it does not cut or escape, and
// what it accepts passes New's validation or is refused there with
// ErrInvalid too.
func FuzzConfigFromEnv(f *testing.F) {
	f.Add("statestore", "20000-32767", "22000-22100,25565", "/tmp/berth", "10s", "true", "", "", "info")
	f.Add("mru", "1-65535", "", "", "1ns", "false", "postgres://u:pw@h/db", "git", "debug")
	f.Add("fast", "0-10", ",", "\x00", "-1s", "maybe", "POSTGRES://h", "env:X", "loud")
	f.Fuzz(func(t *testing.T, mode, rng, exclude, dir, timeout, overlap, dsnValue, scope, logLevel string) {
		env := map[string]string{
			envMode: mode, envPortRange: rng, envPortExclude: exclude, envStateDir: dir, envTimeout: timeout,
			envAllowEphemeralOverlap: overlap, envAllowPrivileged: overlap, envAllowBrowserRestricted: overlap,
			envStore: dsnValue, envScope: scope, envLog: logLevel,
		}
		c, err := Config{}.fromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			var errs []error
			if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // the join itself is what is checked
				errs = j.Unwrap()
			} else {
				errs = []error{err}
			}
			for _, e := range errs {
				var fe *store.FieldError
				if !errors.As(e, &fe) || !strings.HasPrefix(fe.Field, "BERTH_") || !errors.Is(e, store.ErrInvalid) {
					t.Fatalf("fromEnv error %v; want a *FieldError naming a BERTH_ variable", e)
				}
				if msg := e.Error(); len(msg) > 2048 || !utf8.ValidString(msg) || strings.ContainsAny(msg, "\x00\x1b\n") {
					t.Fatalf("fromEnv error %q is long or not printable", msg)
				}
			}
			return
		}
		c.IgnoreEnv = true
		if c.StateDir == "" {
			c.StateDir = "/nonexistent"
		}
		if _, err := c.withDefaults(); err != nil && !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("withDefaults(%+v) = %v; want nil or ErrInvalid", c, err)
		}
	})
}
