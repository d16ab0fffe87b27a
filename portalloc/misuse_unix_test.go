//go:build unix

package portalloc_test

import (
	"net"
	"testing"

	"github.com/berth-go/berth/portalloc/listenfd"
	"github.com/berth-go/berth/store"
)

func init() {
	misuseExtra = append(misuseExtra, func(t *testing.T) []misuse {
		t.Helper()
		l, err := net.Listen("tcp", "127.0.0.1:0") // bound by the OS's choice: no port of a range
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		var h listenfd.Handoff
		t.Cleanup(func() { _ = h.Close() })
		return []misuse{
			{"Handoff.Apply(nil)", func() error { return h.Apply(nil) }, store.ErrInvalid},
			{"Handoff.Add", func() error { return h.Add("web", l) }, nil},
			{"Handoff.Add of a name twice", func() error { return h.Add("web", l) }, store.ErrInvalid},
			{"Handoff.Add with ':' in the name", func() error { return h.Add("a:b", l) }, store.ErrInvalid},
			{"Handoff.Add with an ESC in the name", func() error { return h.Add("a\x1b[31m", l) }, store.ErrInvalid},
			{"Handoff.Add with an empty name", func() error { return h.Add("", l) }, store.ErrInvalid},
			{"Handoff.Add of a nil listener", func() error { return h.Add("api", nil) }, store.ErrInvalid},
		}
	})
}
