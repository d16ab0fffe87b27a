package portalloc_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
)

// TestConfigHidesPassword: no verb of fmt shows the password of a
// Config's Store, nor does the error that refuses a Store.
func TestConfigHidesPassword(t *testing.T) {
	const pw = "Sekr3t-PW-9f2"
	for _, store := range []string{
		"postgres://u:" + pw + "@db.example/berth",
		"postgres://u@db.example/berth?password=" + pw,
		"postgresql://u:" + pw + "@h1,h2:5433/berth",
		"host=db.example password='" + pw + " x' dbname=berth",
		"postgre://u:" + pw + "@db.example/berth",
	} {
		cfg := portalloc.Config{StoreDSN: store, Host: "h", Range: portalloc.Range{First: 20000, Last: 20010}}
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
			got := fmt.Sprintf(verb, cfg)
			if strings.Contains(got, pw) || !strings.Contains(got, "xxxxx") || !strings.Contains(got, "berth") {
				t.Errorf("fmt.Sprintf(%q, Config{StoreDSN: %q}) = %q; want the fields, the password hidden", verb, pgstore.Redact(store), strings.ReplaceAll(got, pw, "<secret>"))
			}
		}
		if got := fmt.Sprintf("%#v", cfg); !strings.HasPrefix(got, "portalloc.Config{") {
			t.Errorf("%%#v of a Config = %q; want it to start portalloc.Config{", strings.ReplaceAll(got, pw, "<secret>"))
		}
		if got := fmt.Sprintf("%v", &cfg); strings.Contains(got, pw) {
			t.Errorf("%%v of a *Config shows the password")
		}
	}
	t.Setenv(portalloc.EnvStore, "POSTGRES://u:"+pw+"@db.example/berth")
	_, err := portalloc.ConfigFromEnv()
	var fe *portalloc.FieldError
	if !errors.As(err, &fe) || fe.Field != portalloc.EnvStore || strings.Contains(fmt.Sprintf("%v %+v %#v", err, err, fe), pw) || !strings.Contains(err.Error(), "lower case") {
		t.Errorf("ConfigFromEnv with an upper-case scheme = %v; want a *FieldError for %s, saying the scheme is in lower case, the password hidden", strings.ReplaceAll(fmt.Sprint(err), pw, "<secret>"), portalloc.EnvStore)
	}
}
