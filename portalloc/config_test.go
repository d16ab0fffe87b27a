package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// berthVars are the variables of a Config. unsetBerthEnv empties them for
// the test, so that a developer's own do not leak into it.
var berthVars = []string{
	"BERTH_MODE", "BERTH_STATE_DIR", "BERTH_STORE", "BERTH_HOST", "BERTH_PORT_RANGE", "BERTH_PORT_EXCLUDE",
	"BERTH_ALLOW_EPHEMERAL_OVERLAP", "BERTH_ALLOW_PRIVILEGED", "BERTH_ALLOW_BROWSER_RESTRICTED",
	"BERTH_SCOPE", "BERTH_TIMEOUT", "BERTH_LOG",
}

func unsetBerthEnv(t *testing.T) {
	t.Helper()
	for _, v := range berthVars {
		t.Setenv(v, "")
	}
}

// TestConfigFromEnvironment: a zero Config takes every field from its
// BERTH_* variable; a field set in code wins over its variable; IgnoreEnv
// reads none.
func TestConfigFromEnvironment(t *testing.T) {
	unsetBerthEnv(t)
	t.Setenv("BERTH_MODE", "mru")
	t.Setenv("BERTH_PORT_RANGE", "21000-21999")
	t.Setenv("BERTH_PORT_EXCLUDE", "21100-21199,21500")
	t.Setenv("BERTH_STATE_DIR", "/tmp/x")
	t.Setenv("BERTH_TIMEOUT", "3s")
	t.Setenv("BERTH_ALLOW_EPHEMERAL_OVERLAP", "true")
	t.Setenv("BERTH_ALLOW_BROWSER_RESTRICTED", "1")
	t.Setenv("BERTH_HOST", "ci-7")
	t.Setenv("BERTH_SCOPE", "shop")
	c, err := portalloc.Config{}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	want := portalloc.Config{
		Mode: portalloc.ModeMRU, Range: store.Range{First: 21000, Last: 21999},
		Exclude:  []store.Range{{First: 21100, Last: 21199}, {First: 21500, Last: 21500}},
		StateDir: "/tmp/x", Timeout: 3 * time.Second, AllowEphemeralOverlap: true, AllowBrowserRestricted: true,
		Host: "ci-7", Scope: "shop", Order: portalloc.OrderRandom,
	}
	if c.Mode != want.Mode || c.Range != want.Range || len(c.Exclude) != 2 || c.Exclude[0] != want.Exclude[0] || c.Exclude[1] != want.Exclude[1] ||
		c.StateDir != want.StateDir || c.Timeout != want.Timeout || !c.AllowEphemeralOverlap || !c.AllowBrowserRestricted || c.AllowPrivileged ||
		c.Host != want.Host || c.Scope != want.Scope || c.Order != want.Order {
		t.Errorf("Config{}.Resolve() = %+v; want %+v", c, want)
	}

	// A field set in code wins over its variable.
	c, err = portalloc.Config{Mode: portalloc.ModeStateStore, Range: store.Range{First: 29000, Last: 29099}, StateDir: "/tmp/y", Timeout: time.Second, Exclude: []store.Range{}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != portalloc.ModeStateStore || c.Range.First != 29000 || c.StateDir != "/tmp/y" || c.Timeout != time.Second || len(c.Exclude) != 0 {
		t.Errorf("Resolve of a Config with fields set = %+v; want the fields, not the variables", c)
	}

	// IgnoreEnv: the defaults, whatever the variables say.
	c, err = portalloc.Config{IgnoreEnv: true, StateDir: "/tmp/z"}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != portalloc.ModeStateStoreWithFallback || c.Range != portalloc.DefaultRange || c.Exclude != nil || c.Timeout != portalloc.DefaultTimeout ||
		c.AllowEphemeralOverlap || c.AllowBrowserRestricted || c.Host != "" || c.Scope != "" {
		t.Errorf("Resolve with IgnoreEnv = %+v; want the defaults", c)
	}

	// New resolves the same way, and Config() returns the result.
	t.Setenv("BERTH_STATE_DIR", t.TempDir())
	t.Setenv("BERTH_PORT_RANGE", allocRange.String())
	t.Setenv("BERTH_SCOPE", "")
	a, err := portalloc.New(context.Background(), portalloc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := a.Config(); got.Mode != portalloc.ModeMRU || got.Range != allocRange || got.Timeout != 3*time.Second {
		t.Errorf("New(Config{}).Config() = %+v; want the variables' mode, range and timeout", got)
	}
}

// TestConfigEnvRefused: a variable New refuses is a *FieldError naming
// the variable; every bad variable is reported, each by name, joined.
func TestConfigEnvRefused(t *testing.T) {
	unsetBerthEnv(t)
	for name, value := range map[string]string{
		"BERTH_MODE":                     "turbo",
		"BERTH_PORT_RANGE":               "1-2-3",
		"BERTH_PORT_EXCLUDE":             "5,,6",
		"BERTH_TIMEOUT":                  "soon",
		"BERTH_ALLOW_EPHEMERAL_OVERLAP":  "maybe",
		"BERTH_ALLOW_PRIVILEGED":         "yes please",
		"BERTH_ALLOW_BROWSER_RESTRICTED": "2",
		"BERTH_LOG":                      "trace",
		"BERTH_STORE":                    "db.example",
		"BERTH_SCOPE":                    "env:SHOP",
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			_, err := portalloc.Config{StateDir: t.TempDir()}.Resolve()
			var fe *store.FieldError
			if !errors.As(err, &fe) || fe.Field != name || !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), name) {
				t.Errorf("Resolve with %s=%q = %v; want a *FieldError (ErrInvalid) naming %s", name, value, err, name)
			}
			// New refuses it the same way, before it opens anything.
			dir := filepath.Join(t.TempDir(), "never")
			if a, err := portalloc.New(context.Background(), portalloc.Config{StateDir: dir}); err == nil {
				_ = a.Close()
				t.Errorf("New with %s=%q = an Allocator; want the error", name, value)
			}
		})
	}

	t.Setenv("BERTH_PORT_RANGE", "abc")
	t.Setenv("BERTH_PORT_EXCLUDE", "1-2,70000")
	t.Setenv("BERTH_MODE", "fast")
	_, err := portalloc.Config{}.Resolve()
	j, ok := errors.Unwrap(err).(interface{ Unwrap() []error }) //nolint:errorlint // the join itself is what is tested
	if !ok || len(j.Unwrap()) != 3 {
		t.Fatalf("Resolve with three bad variables = %v; want three joined errors", err)
	}
	if strings.Count(err.Error(), "portalloc: ") != 1 {
		t.Errorf("Resolve = %q; want one prefix", err)
	}
	for i, want := range []struct{ field, value, at, says string }{
		{"BERTH_MODE", "fast", "", `"statestore", "statestore-with-fallback" or "mru"`},
		{"BERTH_PORT_RANGE", "abc", "", `"abc" is not a port number`},
		{"BERTH_PORT_EXCLUDE", "1-2,70000", `item 2 "70000"`, ""},
	} {
		var fe *store.FieldError
		if !errors.As(j.Unwrap()[i], &fe) || fe.Field != want.field || fe.Value != want.value || fe.At != want.at || !strings.Contains(fe.Want, want.says) {
			t.Errorf("joined error %d = %v; want a *FieldError{Field: %q, Value: %q, At: %q} saying %q", i, j.Unwrap()[i], want.field, want.value, want.at, want.says)
		}
	}
}

// TestConfigHidesPassword: no verb of fmt shows the password of a
// Config's StoreDSN, nor does the error that refuses one.
func TestConfigHidesPassword(t *testing.T) {
	unsetBerthEnv(t)
	const pw = "Sekr3t-PW-9f2"
	for _, s := range []string{
		"postgres://u:" + pw + "@db.example/berth",
		"postgres://u@db.example/berth?password=" + pw,
		"postgresql://u:" + pw + "@h1,h2:5433/berth",
		"host=db.example password='" + pw + " x' dbname=berth",
		"postgre://u:" + pw + "@db.example/berth",
	} {
		cfg := portalloc.Config{StoreDSN: s, Host: "h", Range: store.Range{First: 20000, Last: 20010}}
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
			got := fmt.Sprintf(verb, cfg)
			if strings.Contains(got, pw) || !strings.Contains(got, dsn.Redacted) || !strings.Contains(got, "berth") {
				t.Errorf("fmt.Sprintf(%q, Config{StoreDSN: %q}) = %q; want the fields, the password hidden", verb, dsn.Redact(s), strings.ReplaceAll(got, pw, "<secret>"))
			}
		}
		if got := fmt.Sprintf("%#v", cfg); !strings.HasPrefix(got, "portalloc.Config{") {
			t.Errorf("%%#v of a Config = %q; want it to start portalloc.Config{", strings.ReplaceAll(got, pw, "<secret>"))
		}
		if got := fmt.Sprintf("%v %v", &cfg, []portalloc.Config{cfg}); strings.Contains(got, pw) {
			t.Errorf("%%v of a *Config or []Config shows the password")
		}
	}
	t.Setenv("BERTH_STORE", "POSTGRES://u:"+pw+"@db.example/berth")
	_, err := portalloc.Config{}.Resolve()
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "BERTH_STORE" || strings.Contains(fmt.Sprintf("%v %+v %#v", err, err, fe), pw) || !strings.Contains(err.Error(), "lower case") {
		t.Errorf("Resolve with an upper-case scheme = %v; want a *FieldError for BERTH_STORE, saying the scheme is in lower case, the password hidden", strings.ReplaceAll(fmt.Sprint(err), pw, "<secret>"))
	}
}

// TestStoreConfigRefused: Config.StoreDSN and BERTH_STORE take connection
// strings only, the MRU mode cannot serve a fleet, and a fleet's store
// never falls back.
func TestStoreConfigRefused(t *testing.T) {
	unsetBerthEnv(t)
	for _, tc := range []struct {
		cfg   portalloc.Config
		field string
	}{
		{portalloc.Config{StoreDSN: "db.example"}, "Config.StoreDSN"},
		{portalloc.Config{StoreDSN: "relative/dir"}, "Config.StoreDSN"},
		{portalloc.Config{StoreDSN: "mysql://u:hunter2@db.example/berth"}, "Config.StoreDSN"},
		{portalloc.Config{StoreDSN: "postgres://db.example/berth", Mode: portalloc.ModeMRU}, "Config.Mode"},
	} {
		tc.cfg.StateDir = t.TempDir()
		_, err := tc.cfg.Resolve()
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, store.ErrInvalid) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Resolve(StoreDSN %q, Mode %q) = %v; want a *FieldError for %s", tc.cfg.StoreDSN, tc.cfg.Mode, err, tc.field)
		}
	}
	t.Setenv("BERTH_STORE", "postgres://u:secret@db.example/berth")
	t.Setenv("BERTH_HOST", "ci-7")
	cfg, err := portalloc.Config{}.Resolve()
	if err != nil || cfg.StoreDSN != "postgres://u:secret@db.example/berth" || cfg.Host != "ci-7" {
		t.Errorf("Resolve = %+v, %v; want StoreDSN and Host from BERTH_STORE and BERTH_HOST", cfg, err)
	}
	if cfg.Mode != portalloc.ModeStateStore {
		t.Errorf("Resolve with a StoreDSN: Mode %q; want %q, no fallback", cfg.Mode, portalloc.ModeStateStore)
	}
}

// TestEphemeralRangeCutOut: the part of Range inside the OS ephemeral range
// is left out of allocation, unless AllowEphemeralOverlap keeps it.
func TestEphemeralRangeCutOut(t *testing.T) {
	eph := ephemeralRange(t)
	if eph.First < 1100 {
		t.Skipf("skipping: the OS ephemeral range %v leaves no room below it", eph)
	}
	// 1,000 ports below the ephemeral range and 100 inside it.
	r := store.Range{First: eph.First - 1000, Last: eph.First + 99}
	for _, e := range testports.All {
		if e.Package != "portalloc" && r.Overlaps(store.Range(e.Range)) {
			t.Skipf("skipping: %v, at the foot of this host's ephemeral range %v, overlaps the test range of %s", r, eph, e.Package)
		}
	}
	ctx := context.Background()
	cut := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: r})
	if ports, _, err := cut.Usage(ctx); err != nil || ports != 1000 || cut.Stats().Ports != 1000 {
		t.Errorf("Usage() ports with the overlap cut out = %d, %v; want 1000", ports, err)
	}
	for range 50 {
		got, err := cut.Allocate(ctx, portalloc.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Port >= eph.First {
			t.Fatalf("Allocate = %d, inside the ephemeral range %v", got.Port, eph)
		}
	}
	kept := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: r, AllowEphemeralOverlap: true})
	if ports, _, err := kept.Usage(ctx); err != nil || ports != 1100 {
		t.Errorf("Usage() ports with the overlap allowed = %d, %v; want 1100", ports, err)
	}
}

// TestPrivilegedRange: a Range below 1024 is refused, naming what allows
// it, unless AllowPrivileged (or BERTH_ALLOW_PRIVILEGED) allows it.
func TestPrivilegedRange(t *testing.T) {
	unsetBerthEnv(t)
	rng := store.Range{First: 1000, Last: 1099}
	_, err := portalloc.Config{Range: rng, StateDir: t.TempDir()}.Resolve()
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "Config.Range" || !strings.Contains(fe.Want, "AllowPrivileged") || !strings.Contains(fe.Want, "BERTH_ALLOW_PRIVILEGED") {
		t.Errorf("Resolve(Range %v) = %v; want a *FieldError for Config.Range naming AllowPrivileged", rng, err)
	}
	if _, err := (portalloc.Config{Range: rng, StateDir: t.TempDir(), AllowPrivileged: true}).Resolve(); err != nil {
		t.Errorf("Resolve(Range %v, AllowPrivileged) = %v; want it allowed", rng, err)
	}
	t.Setenv("BERTH_ALLOW_PRIVILEGED", "true")
	c, err := portalloc.Config{Range: rng, StateDir: t.TempDir()}.Resolve()
	if err != nil || !c.AllowPrivileged {
		t.Errorf("Resolve(Range %v) with BERTH_ALLOW_PRIVILEGED=true = %+v, %v; want it allowed", rng, c, err)
	}
	if _, err := (portalloc.Config{Range: store.Range{First: 1024, Last: 1100}, StateDir: t.TempDir(), IgnoreEnv: true}).Resolve(); err != nil {
		t.Errorf("Resolve(Range 1024-1100) = %v; want it allowed: no port below 1024", err)
	}
}

// TestExclude: Config.Exclude (and BERTH_PORT_EXCLUDE) leave ports out of
// Allocate, not out of Reserve; a range with nothing left is refused.
func TestExclude(t *testing.T) {
	unsetBerthEnv(t)
	ctx := context.Background()
	base := freeRun(t, 10)
	rng := store.Range{First: base, Last: base + 9}
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, Range: rng, AllowEphemeralOverlap: true,
		Exclude: []store.Range{{First: base, Last: base + 3}, {First: base + 8, Last: base + 8}}})
	if st := a.Stats(); st.Ports != 5 {
		t.Errorf("Stats().Ports = %d; want 5 of 10 with 5 excluded", st.Ports)
	}
	var got []uint16
	for {
		r, err := a.Allocate(ctx, portalloc.Request{})
		if errors.Is(err, store.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Port)
	}
	for _, p := range got {
		if p <= base+3 || p == base+8 {
			t.Errorf("Allocate handed out %d, which Config.Exclude leaves out", p)
		}
	}
	if len(got) != 5 {
		t.Errorf("Allocate handed out %v; want the 5 ports not excluded", got)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, base); err != nil {
		t.Errorf("Reserve(%d), excluded = %v; want it taken: Exclude is for Allocate", base, err)
	}

	t.Setenv("BERTH_PORT_EXCLUDE", fmt.Sprintf("%d-%d", base, base+8))
	c, err := portalloc.Config{Range: rng, StateDir: t.TempDir(), AllowEphemeralOverlap: true}.Resolve()
	if err != nil || len(c.Exclude) != 1 || c.Exclude[0] != (store.Range{First: base, Last: base + 8}) {
		t.Errorf("Resolve with BERTH_PORT_EXCLUDE = %+v, %v", c.Exclude, err)
	}
	_, err = portalloc.New(ctx, portalloc.Config{StateDir: t.TempDir(), Range: rng, AllowEphemeralOverlap: true, Exclude: []store.Range{rng}, IgnoreEnv: true})
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "Config.Range" {
		t.Errorf("New with every port excluded = %v; want a *FieldError for Config.Range", err)
	}
}

// TestReserveInMRUMode: without a store, Reserve probes the port, refuses
// one that is bound, and remembers the one it hands out, so Allocate skips
// it.
func TestReserveInMRUMode(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 2)
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeMRU, Range: store.Range{First: base, Last: base + 1}, AllowEphemeralOverlap: true})
	l := mustListen(t, lo4, base+1)
	defer l.Close()
	_, err := a.Reserve(ctx, portalloc.Request{}, base+1)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !ce.Bound || ce.Holder.Owner.PID != 0 {
		t.Fatalf("Reserve of a bound port in MRU mode = %v; want a ConflictError for a process outside berth", err)
	}
	r, err := a.Reserve(ctx, portalloc.Request{}, base)
	if err != nil || r.Port != base {
		t.Fatalf("Reserve of a free port in MRU mode = %+v, %v", r, err)
	}
	// base is recorded as handed out, base+1 is bound: nothing is left.
	if got, err := a.Allocate(ctx, portalloc.Request{}); !errors.Is(err, store.ErrExhausted) {
		t.Errorf("Allocate after Reserve = %+v, %v; want ErrExhausted (the reserved port is recent)", got, err)
	}
	if st := a.Stats(); st.Allocations.Static != 1 || st.Errors.Static != 1 || st.Errors.Dynamic != 1 || st.Fallback != "" || st.Held != 1 {
		t.Errorf("Stats() = %+v; want 1 static allocation, 1 static and 1 dynamic error, 1 held, no fallback", st)
	}
	if rows := storeRows(t, a.Config().StateDir, store.Filter{}); len(rows) != 0 {
		t.Errorf("ModeMRU wrote rows to the store: %v", rows)
	}
}

// TestDefaultRange: the zero Range is 20000-32767. Every test package's
// range lies inside it, so this test allocates nothing from it.
func TestDefaultRange(t *testing.T) {
	a, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got, want := a.Config().Range, (store.Range{First: 20000, Last: 32767}); got != want || portalloc.DefaultRange != want {
		t.Errorf("Config().Range with a zero Range = %v, DefaultRange = %v; want %v", got, portalloc.DefaultRange, want)
	}
	if got := a.Config(); got.Timeout != portalloc.DefaultTimeout || got.Order != portalloc.OrderRandom {
		t.Errorf("Config() = %+v; want the default timeout and order", got)
	}
}

func init() {
	// logged allocates one port with the Config of the environment.
	workers["logged"] = func(ctx context.Context) error {
		a, err := portalloc.New(ctx, portalloc.Config{})
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		_, err = a.Allocate(ctx, portalloc.Request{Label: "logged"})
		return err
	}
}

// TestBerthLog: BERTH_LOG turns on an slog text log on standard error at
// the level it names; a value it does not know is an error naming it.
func TestBerthLog(t *testing.T) {
	unsetBerthEnv(t)
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
			"BERTH_LOG="+tc.level,
			"BERTH_STATE_DIR="+t.TempDir(),
			"BERTH_MODE=statestore",
			"BERTH_PORT_RANGE="+allocRange.String())
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
}
