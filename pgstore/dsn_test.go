package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/internal/pgcluster"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/store"
)

// TestOpenRefusesOtherSchemes: a DSN that is neither a postgres:// or
// postgresql:// URL (in lower case) nor key=value settings is refused
// before any connection, with a *store.FieldError for "dsn" that says why
// and hides the password, in its message, its Value and every fmt verb.
func TestOpenRefusesOtherSchemes(t *testing.T) {
	t0 := pgcluster.Guard(t, pw)
	for _, tc := range []struct{ dsn, why string }{
		{"postgre://u:" + pw + "@127.0.0.1:1/db", `scheme "postgre://" is not "postgres://" or "postgresql://"`},
		{"POSTGRES://u:" + pw + "@127.0.0.1:1/db", "must be in lower case"},
		{"PostgreSQL://u@127.0.0.1:1/db?password=" + pw, "must be in lower case"},
		{"u:" + pw + "@127.0.0.1:1/db", "neither a URL nor key=value"},
		{"host=db password='" + pw, "neither a URL nor key=value"},
		{"host=db password=" + pw + " 'x'=y", "setting 3 is not a word"},
	} {
		start := time.Now()
		_, err := pgstore.Open(context.Background(), tc.dsn, pgstore.Options{Host: "h", SweepInterval: -1})
		var fe *store.FieldError
		switch {
		case !errors.As(err, &fe) || fe.Field != "dsn" || !errors.Is(err, store.ErrInvalid):
			t0.Errorf("Open(%q) = %v; want a *store.FieldError for dsn", dsn.Redact(tc.dsn), err)
		case strings.Contains(fmt.Sprintf("%v %+v %#v %s %#v", err, err, err, fe.Value, *fe), pw):
			t0.Errorf("Open(%q) = %v; shows the password", dsn.Redact(tc.dsn), err)
		case fe.Value != dsn.Redact(tc.dsn) || !strings.Contains(fe.Want, tc.why) || !strings.Contains(err.Error(), tc.why):
			t0.Errorf("Open(%q) = %v (value %q); want the DSN redacted as the value and to say %q", dsn.Redact(tc.dsn), err, fe.Value, tc.why)
		}
		if took := time.Since(start); took > time.Second {
			t0.Errorf("Open(%q) took %v; want a refusal before any connection", dsn.Redact(tc.dsn), took)
		}
	}
}
