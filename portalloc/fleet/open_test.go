package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// TestOpenRefusesWhatIsNoStore: open, called directly, refuses a
// Config.StoreDSN that is not a connection string or a socket directory,
// with a *store.FieldError for Config.StoreDSN that hides its password,
// before connecting.
func TestOpenRefusesWhatIsNoStore(t *testing.T) {
	const pw = "Sekr3t-PW-9f2"
	for _, s := range []string{
		"",
		"db.example",
		"relative/dir",
		"POSTGRES://u:" + pw + "@db.example/berth",
		"postgre://u@db.example/berth?password=" + pw,
		"host=db.example password='" + pw,
	} {
		start := time.Now()
		_, err := open(context.Background(), portalloc.Config{StoreDSN: s})
		var fe *store.FieldError
		shown := strings.ReplaceAll(s, pw, "<pw>")
		switch {
		case !errors.As(err, &fe) || fe.Field != "Config.StoreDSN" || !errors.Is(err, store.ErrInvalid):
			t.Errorf("open(StoreDSN %q) = %v; want a *store.FieldError for Config.StoreDSN", shown, err)
		case strings.Contains(fmt.Sprintf("%v %+v %#v %#v", err, err, err, *fe), pw):
			t.Errorf("open(StoreDSN %q) = %v; shows the password", shown, strings.ReplaceAll(err.Error(), pw, "<pw>"))
		case !strings.Contains(fe.Want, "connection string") || !strings.Contains(fe.Want, "unix socket"):
			t.Errorf("open(StoreDSN %q) = %v; want it to say what it takes", shown, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("open(StoreDSN %q) took %v; want a refusal before any connection", shown, took)
		}
	}
}
