package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
)

// TestOpenRefusesWhatIsNoStore: open, called directly, refuses a
// Config.Store that is not a connection string or a socket directory,
// with a *FieldError that hides its password, before connecting.
func TestOpenRefusesWhatIsNoStore(t *testing.T) {
	const pw = "Sekr3t-PW-9f2"
	for _, s := range []string{"", "db.example", "POSTGRES://u:" + pw + "@db.example/berth"} {
		_, err := open(context.Background(), portalloc.Config{Store: s}, false)
		var fe *portalloc.FieldError
		if !errors.As(err, &fe) || fe.Field != "Config.Store" || !errors.Is(err, portalloc.ErrInvalidRequest) || strings.Contains(err.Error(), pw) {
			t.Errorf("open(Store %q) = %v; want a *FieldError for Config.Store, the password hidden", strings.ReplaceAll(s, pw, "<pw>"), err)
		}
	}
}
