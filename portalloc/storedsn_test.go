package portalloc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
)

// TestStoreDSNAndItsOldName: Config.StoreDSN and its deprecated name
// Config.Store are both honoured. A field left as ConfigFromEnv filled it
// (or zero) yields to the other, so a program that sets or clears Store
// after ConfigFromEnv goes on working; two different databases are
// refused with a *FieldError for Config.StoreDSN. portalloc.New, which
// links no PostgreSQL client, refuses a database with a *FieldError for
// the field that named it, quoting it: which database won shows there.
func TestStoreDSNAndItsOldName(t *testing.T) {
	const (
		env = "postgres://env.example/berth"
		dsn = "postgres://new.example/berth"
		old = "postgres://old.example/berth"
	)
	for _, tt := range []struct {
		name      string
		env       bool                      // start from ConfigFromEnv with BERTH_STORE set, else from a zero Config
		set       func(c *portalloc.Config) // what the program sets then
		wantField string                    // "" for no database: New succeeds on the SQLite store
		wantValue string                    // the database New was asked to open
		wantWant  string                    // in FieldError.Want
	}{
		{"StoreDSN", false, func(c *portalloc.Config) { c.StoreDSN = dsn }, "Config.StoreDSN", dsn, "fleet.New"},
		{"Store", false, func(c *portalloc.Config) { c.Store = old }, "Config.Store", old, "fleet.New"},                                 //nolint:staticcheck // the deprecated name still works
		{"both alike", false, func(c *portalloc.Config) { c.StoreDSN, c.Store = dsn, dsn }, "Config.StoreDSN", dsn, "fleet.New"},        //nolint:staticcheck // as above
		{"both differ", false, func(c *portalloc.Config) { c.StoreDSN, c.Store = dsn, old }, "Config.StoreDSN", dsn, "deprecated name"}, //nolint:staticcheck // as above
		{"env", true, func(*portalloc.Config) {}, "Config.StoreDSN", env, "fleet.New"},
		{"env, StoreDSN set", true, func(c *portalloc.Config) { c.StoreDSN = dsn }, "Config.StoreDSN", dsn, "fleet.New"},
		{"env, Store set", true, func(c *portalloc.Config) { c.Store = old }, "Config.Store", old, "fleet.New"}, //nolint:staticcheck // an old program overrides BERTH_STORE
		{"env, Store cleared", true, func(c *portalloc.Config) { c.Store = "" }, "", "", ""},                    //nolint:staticcheck // an old program clears it
		{"env, StoreDSN cleared", true, func(c *portalloc.Config) { c.StoreDSN = "" }, "", "", ""},
		{"env, both set apart", true, func(c *portalloc.Config) { c.StoreDSN, c.Store = dsn, old }, "Config.StoreDSN", dsn, "deprecated name"}, //nolint:staticcheck // as above
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cfg portalloc.Config
			if tt.env {
				t.Setenv(portalloc.EnvStore, env)
				var err error
				if cfg, err = portalloc.ConfigFromEnv(); err != nil {
					t.Fatal(err)
				}
				if cfg.StoreDSN != env || cfg.Store != env { //nolint:staticcheck // old programs read Store
					t.Fatalf("ConfigFromEnv: StoreDSN %q, Store %q; want both %q from %s", cfg.StoreDSN, cfg.Store, env, portalloc.EnvStore) //nolint:staticcheck // as above
				}
			}
			tt.set(&cfg)
			cfg.StateDir, cfg.Range = t.TempDir(), allocRange
			a, err := portalloc.New(context.Background(), cfg)
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("New = %v; want an Allocator on the SQLite store", err)
				}
				if c := a.Config(); c.StoreDSN != "" || c.Store != "" { //nolint:staticcheck // Config() sets both
					t.Errorf("Config(): StoreDSN %q, Store %q; want both empty", c.StoreDSN, c.Store) //nolint:staticcheck // as above
				}
				_ = a.Close()
				return
			}
			if a != nil {
				_ = a.Close()
			}
			var fe *portalloc.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.wantField || fe.Value != tt.wantValue || !strings.Contains(fe.Want, tt.wantWant) ||
				!errors.Is(err, portalloc.ErrInvalidRequest) {
				t.Errorf("New = %v; want a *FieldError for %s, value %s, saying %q", err, tt.wantField, tt.wantValue, tt.wantWant)
			}
		})
	}
}
