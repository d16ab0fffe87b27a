package pool_test

import (
	"errors"
	"testing"

	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/store"
)

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
		n, err := pool.ParseMaxUnavailable(s, size)
		if err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("ParseMaxUnavailable(%q) error %v does not wrap ErrInvalidRequest", s, err)
			}
			return
		}
		if n < 1 {
			t.Fatalf("ParseMaxUnavailable(%q, %d) = %d; want at least 1", s, size, n)
		}
	})
}
