package portalloc_test

import (
	"errors"
	"testing"

	"github.com/berth-go/berth/portalloc"
)

// FuzzParseSetSpec: a set spec from a file never panics the parser, is
// rejected with ErrInvalidRequest, or validates and survives a round trip.
func FuzzParseSetSpec(f *testing.F) {
	f.Add([]byte(`{"name":"dev","groups":[{"name":"api","members":3,"ports":[{"name":"http"},{"name":"grpc","scope":"group"}]},{"name":"web","ports":[{"name":"http"}],"refs":[{"env":"G","to":"api.grpc"},{"env":"H","to":"api.0.http"}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","members":0,"ports":[{"name":"p","port":65535,"protocol":"udp","address":"::1","env":"P","sticky":false}]}]}`))
	f.Add([]byte(`{"name":"x","groups":[{"name":"a","ports":[{"name":"p"}],"refs":[{"env":"X","to":"a.9.p"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := portalloc.ParseSetSpec(data)
		if err != nil {
			if !errors.Is(err, portalloc.ErrInvalidRequest) {
				t.Fatalf("ParseSetSpec error %v does not wrap ErrInvalidRequest", err)
			}
			return
		}
		if err := spec.Validate(); err != nil {
			t.Fatalf("a parsed spec does not validate: %v", err)
		}
	})
}

// FuzzParseMaxUnavailable: the result is always within 1..size (or size's
// percentage rounded up), or an ErrInvalidRequest.
func FuzzParseMaxUnavailable(f *testing.F) {
	for _, s := range []string{"25%", "3", "0", "100%", "abc", "-1", "150%", "99999999999999999999"} {
		f.Add(s, 10)
	}
	f.Fuzz(func(t *testing.T, s string, size int) {
		if size < 0 || size > 1<<20 {
			return
		}
		n, err := portalloc.ParseMaxUnavailable(s, size)
		if err != nil {
			if !errors.Is(err, portalloc.ErrInvalidRequest) {
				t.Fatalf("ParseMaxUnavailable(%q) error %v does not wrap ErrInvalidRequest", s, err)
			}
			return
		}
		if n < 1 {
			t.Fatalf("ParseMaxUnavailable(%q, %d) = %d; want at least 1", s, size, n)
		}
	})
}
