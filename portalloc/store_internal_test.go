package portalloc

import (
	"testing"
)

func TestStoreDSN(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://db/berth":   "postgres://db/berth",
		"host=/run/pg dbname=b": "host=/run/pg dbname=b",
		"/run/postgresql":       "host='/run/postgresql'",
		"/tmp/it's":             `host='/tmp/it\'s'`,
		"/tmp/a=b":              "host='/tmp/a=b'",
	} {
		if got, err := storeDSN(in); err != nil || got != want {
			t.Errorf("storeDSN(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"db.example", "postgre://u:pw@h/db", "POSTGRES://u:pw@h/db", "Postgresql://h/db", "host = /x db-name=y"} {
		if got, err := storeDSN(in); err == nil {
			t.Errorf("storeDSN(%q) = %q, nil; want an error", in, got)
		}
	}
}
