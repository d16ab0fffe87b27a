package dsn

import (
	"errors"
	"strings"
	"testing"
)

// TestFromStore: a store's name is a connection string Check takes, or the
// absolute path of a socket directory, quoted as libpq quotes a value.
func TestFromStore(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u@db/berth", "postgres://u@db/berth"},
		{"host=/run/postgresql dbname=berth", "host=/run/postgresql dbname=berth"},
		{"/run/postgresql", "host='/run/postgresql'"},
		{`/tmp/it's\here`, `host='/tmp/it\'s\\here'`},
	} {
		if got, err := FromStore(tc.in); err != nil || got != tc.want {
			t.Errorf("FromStore(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"db.example", "relative/dir", "POSTGRES://u:pw@h/db", ""} {
		_, err := FromStore(in)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("FromStore(%q) = %v; want an *Error", in, err)
		}
		if in != "" && strings.Contains(err.Error(), in) {
			t.Errorf("FromStore(%q) error %q quotes the string, which may hold a password", in, err)
		}
	}
}

// TestScrubber: the zero Scrubber hides nothing; one of a DSN hides its
// password wherever an error quotes it, keeping the error's chain.
func TestScrubber(t *testing.T) {
	const pw = "Sekr3t-PW-9f2"
	base := errors.New("connect postgres://u:" + pw + "@h/db: refused")
	if got := (Scrubber{}).Err(base); got.Error() != base.Error() {
		t.Errorf("zero Scrubber.Err changed %v to %v", base, got)
	}
	got := NewScrubber("postgres://u:" + pw + "@h/db").Err(base)
	if strings.Contains(got.Error(), pw) || !errors.Is(got, base) {
		t.Errorf("Scrubber.Err = %q (is base %v); want the password hidden, the chain kept", got, errors.Is(got, base))
	}
	if got := Redact("host=h password=" + pw); got != "host=h password="+Redacted {
		t.Errorf("Redact = %q; want the password replaced by %q", got, Redacted)
	}
}
