package dsn

import (
	"errors"
	"strings"
	"testing"
)

// pw is the password of the tests that check it is never shown.
const pw = "Sekr3t-PW-9f2"

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://berth:" + pw + "@db.example:5432/berth", "postgres://berth:xxxxx@db.example:5432/berth"},
		{"postgresql://berth:" + pw + "@h1:5432,h2:5433/berth?sslmode=disable", "postgresql://berth:xxxxx@h1:5432,h2:5433/berth?sslmode=disable"},
		{"postgres://berth@db/berth?password=" + pw + "&sslmode=disable", "postgres://berth@db/berth?password=xxxxx&sslmode=disable"},
		{"postgres://berth@db/berth?sslpassword=" + pw, "postgres://berth@db/berth?sslpassword=xxxxx"},
		{"postgres://db/berth", "postgres://db/berth"},
		{"postgres://u:p%40ss%3Aw@db/berth#frag", "postgres://u:xxxxx@db/berth#frag"},
		{"postgres://u@db/berth?pass%77ord=" + pw, "postgres://u@db/berth?pass%77ord=xxxxx"},
		{"postgre://u:" + pw + "@h/db", "postgre://u:xxxxx@h/db"},
		{"POSTGRES://u:" + pw + "@h/db?password=" + pw, "POSTGRES://u:xxxxx@h/db?password=xxxxx"},
		{"host=db password=" + pw + " dbname=berth", "host=db password=xxxxx dbname=berth"},
		{"host=db password = '" + pw + " with spaces' dbname=berth", "host=db password = xxxxx dbname=berth"},
		{`host=db password='it\'s ` + pw + `' dbname=berth`, "host=db password=xxxxx dbname=berth"},
		{"host=db passwd=" + pw, "host=db passwd=xxxxx"},
		{"host=db dbname=berth", "host=db dbname=berth"},
		{"host=db password='" + pw, "host=db password=xxxxx"}, // unterminated
		{"u:" + pw + "@h/db", "u:xxxxx@h/db"},
	} {
		if got := Redact(tc.dsn); got != tc.want {
			t.Errorf("Redact(%q) = %q; want %q", tc.dsn, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u@h/db",
		"postgresql://u:" + pw + "@h1,h2/db",
		"host=/run/postgresql dbname=berth",
		"host = db  password = 'a b' ",
		"host=db application_name=a://b",
	} {
		if err := Check(dsn); err != nil {
			t.Errorf("Check(%q) = %v; want nil", dsn, err)
		}
	}
	for _, tc := range []struct{ dsn, why string }{
		{"postgre://u:" + pw + "@h/db", `scheme "postgre://" is not "postgres://" or "postgresql://"`},
		{"POSTGRES://u:" + pw + "@h/db", `scheme "POSTGRES://" must be in lower case`},
		{"Postgresql://u@h/db?password=" + pw, `must be in lower case`},
		{"pg.sql://u:" + pw + "@h/db", "looks like a URL"},
		{"db.example", "neither a URL nor key=value"},
		{"host=db " + pw, "neither a URL nor key=value"},
		{"host=db 'x" + pw + "'=y", "setting 2 is not a word"},
		{"", "neither"},
	} {
		err := Check(tc.dsn)
		var de *Error
		if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("Check(%q) = %v; want an *Error saying %q", tc.dsn, err, tc.why)
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("Check(%q) = %q; shows the password", tc.dsn, err)
		}
	}
}

func TestScrubberErr(t *testing.T) {
	inner := errors.New(`server: unrecognized configuration parameter "postgre://u:` + pw + `@h/db?x"`)
	outer := errors.New("storage failed")
	wrapped := errors.Join(outer, inner)
	err := NewScrubber("postgre://u:" + pw + "@h/db").Err(wrapped)
	if strings.Contains(err.Error(), pw) {
		t.Errorf("Scrubber.Err = %q; shows the password", err)
	}
	if !errors.Is(err, outer) || !errors.Is(err, inner) {
		t.Errorf("Scrubber.Err = %v; want it to wrap what it was given", err)
	}
	if err := NewScrubber("host=h").Err(inner); err != inner { //nolint:errorlint // the very error
		t.Errorf("Scrubber.Err of a DSN without a password = %v; want the error itself", err)
	}
}
