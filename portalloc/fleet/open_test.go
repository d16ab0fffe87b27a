package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
)

// TestOpenRefusesWhatIsNoStore: open, called directly, refuses a
// Config.StoreDSN that is not a connection string or a socket directory,
// with a *FieldError that hides its password, before connecting.
func TestOpenRefusesWhatIsNoStore(t *testing.T) {
	const pw = "Sekr3t-PW-9f2"
	for _, s := range []string{"", "db.example", "POSTGRES://u:" + pw + "@db.example/berth"} {
		_, err := open(context.Background(), portalloc.Config{StoreDSN: s}, false)
		var fe *portalloc.FieldError
		if !errors.As(err, &fe) || fe.Field != "Config.StoreDSN" || !errors.Is(err, portalloc.ErrInvalidRequest) || strings.Contains(err.Error(), pw) {
			t.Errorf("open(StoreDSN %q) = %v; want a *FieldError for Config.StoreDSN, the password hidden", strings.ReplaceAll(s, pw, "<pw>"), err)
		}
	}
}
