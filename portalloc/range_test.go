package portalloc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
)

func TestRange(t *testing.T) {
	r := portalloc.Range{First: 20000, Last: 20009}
	if r.Size() != 10 || !r.Contains(20000) || !r.Contains(20009) || r.Contains(20010) || r.Contains(0) || r.String() != "20000-20009" {
		t.Errorf("Range %v: Size %d, Contains(20000, 20009, 20010, 0) = %v %v %v %v, String %q; want 10, true true false false, 20000-20009",
			r, r.Size(), r.Contains(20000), r.Contains(20009), r.Contains(20010), r.Contains(0), r.String())
	}
	if !r.Overlaps(portalloc.Range{First: 20009, Last: 30000}) || r.Overlaps(portalloc.Range{First: 20010, Last: 30000}) {
		t.Error("Overlaps: want true for a shared last port, false for the next range")
	}
	if one := (portalloc.Range{First: 80, Last: 80}); one.String() != "80" || one.Size() != 1 {
		t.Errorf("Range 80-80: String %q, Size %d; want \"80\", 1", one.String(), one.Size())
	}
	if err := r.Validate(); err != nil {
		t.Errorf("%v.Validate() = %v; want nil", r, err)
	}
}

// TestRangeErrors: every way a range is refused gives a *FieldError that
// names where the text came from, what it was, where in it and why, and
// wraps ErrInvalidRequest.
func TestRangeErrors(t *testing.T) {
	_, errParse := portalloc.ParseRange("30000-20000")
	_, errList := portalloc.ParseRanges("22000-22100,x")
	errValid := portalloc.Range{First: 0, Last: 5}.Validate()
	t.Setenv(portalloc.EnvPortRange, "abc")
	t.Setenv(portalloc.EnvPortExclude, "1-2,70000")
	t.Setenv(portalloc.EnvMode, "fast")
	_, errEnv := portalloc.ConfigFromEnv()
	// ConfigFromEnv reports every bad variable, each by name.
	j, ok := errEnv.(interface{ Unwrap() []error }) //nolint:errorlint // the join itself is what is tested
	if !ok || len(j.Unwrap()) != 3 {
		t.Fatalf("ConfigFromEnv = %v; want three joined errors", errEnv)
	}
	for _, tc := range []struct {
		name                   string
		err                    error
		field, value, at, want string
	}{
		{"ParseRange", errParse, "port range", "30000-20000", "", "the first port is above the last"},
		{"ParseRanges", errList, "port range", "22000-22100,x", `item 2 "x"`, `"x" is not a port number`},
		{"Valid", errValid, "port range", "0-5", "", "port 0 is not a port"},
		{"ConfigFromEnv BERTH_PORT_RANGE", j.Unwrap()[1], portalloc.EnvPortRange, "abc", "", `"abc" is not a port number`},
	} {
		var fe *portalloc.FieldError
		if !errors.As(tc.err, &fe) || fe.Field != tc.field || fe.Value != tc.value || fe.At != tc.at || !strings.Contains(fe.Want, tc.want) || !errors.Is(tc.err, portalloc.ErrInvalidRequest) {
			t.Errorf("%s = %v; want a *FieldError{Field: %q, Value: %q, At: %q} saying %q, wrapping ErrInvalidRequest", tc.name, tc.err, tc.field, tc.value, tc.at, tc.want)
		}
	}
	var fe *portalloc.FieldError
	if !errors.As(j.Unwrap()[0], &fe) || fe.Field != portalloc.EnvMode || fe.Value != "fast" {
		t.Errorf("ConfigFromEnv's first error = %v; want a *FieldError for BERTH_MODE", j.Unwrap()[0])
	}
	if !errors.As(j.Unwrap()[2], &fe) || fe.Field != portalloc.EnvPortExclude || fe.Value != "1-2,70000" || fe.At != `item 2 "70000"` {
		t.Errorf("ConfigFromEnv's third error = %v; want a *FieldError for BERTH_PORT_EXCLUDE naming the item", j.Unwrap()[2])
	}
}
