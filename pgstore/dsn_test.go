package pgstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
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
		if got := pgstore.Redact(tc.dsn); got != tc.want {
			t.Errorf("Redact(%q) = %q; want %q", tc.dsn, got, tc.want)
		}
	}
}

func TestCheckDSN(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u@h/db",
		"postgresql://u:" + pw + "@h1,h2/db",
		"host=/run/postgresql dbname=berth",
		"host = db  password = 'a b' ",
		"host=db application_name=a://b",
	} {
		if err := pgstore.CheckDSN(dsn); err != nil {
			t.Errorf("CheckDSN(%q) = %v; want nil", dsn, err)
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
		err := pgstore.CheckDSN(tc.dsn)
		var de *pgstore.DSNError
		if !errors.As(err, &de) || !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("CheckDSN(%q) = %v; want a *DSNError saying %q", tc.dsn, err, tc.why)
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("CheckDSN(%q) = %q; shows the password", tc.dsn, err)
		}
	}
}

func TestScrubError(t *testing.T) {
	inner := errors.New(`server: unrecognized configuration parameter "postgre://u:` + pw + `@h/db?x"`)
	wrapped := errors.Join(store.ErrStorage, inner)
	err := pgstore.ScrubError("postgre://u:"+pw+"@h/db", wrapped)
	if strings.Contains(err.Error(), pw) {
		t.Errorf("ScrubError = %q; shows the password", err)
	}
	if !errors.Is(err, store.ErrStorage) || !errors.Is(err, inner) {
		t.Errorf("ScrubError = %v; want it to wrap what it was given", err)
	}
	if err := pgstore.ScrubError("host=h", inner); err != inner { //nolint:errorlint // the very error
		t.Errorf("ScrubError of a DSN without a password = %v; want the error itself", err)
	}
}
