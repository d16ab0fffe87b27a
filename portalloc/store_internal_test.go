package portalloc

import (
	"strings"
	"testing"
)

func TestRedactDSN(t *testing.T) {
	for _, dsn := range []string{
		"postgres://berth:s3cret@db.example:5432/berth",
		"host=db.example password=s3cret dbname=berth",
		"host=db.example password = 's3 cret' dbname=berth",
	} {
		if got := redactDSN(dsn); strings.Contains(got, "s3") || !strings.Contains(got, "db.example") {
			t.Errorf("redactDSN(%q) = %q; want the host kept and the password hidden", dsn, got)
		}
	}
}

func TestStoreDSN(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://db/berth":   "postgres://db/berth",
		"host=/run/pg dbname=b": "host=/run/pg dbname=b",
		"/run/postgresql":       "host='/run/postgresql'",
		"/tmp/it's":             `host='/tmp/it\'s'`,
	} {
		if got, err := storeDSN(in); err != nil || got != want {
			t.Errorf("storeDSN(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
