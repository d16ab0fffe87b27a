package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/store"
)

func TestCheckLabel(t *testing.T) {
	tests := []struct {
		label string
		why   string // "" when the label is accepted
	}{
		{"", ""},
		{"api.http", ""},
		{"web server 2", ""},
		{"café ☕", ""},
		{strings.Repeat("a", store.MaxLabelLen), ""},
		{strings.Repeat("a", store.MaxLabelLen+1), "it has 257 bytes"},
		{"x\x1b]0;pwned\a", `it has '\x1b' at byte 1`},
		{"a\tb", `it has '\t' at byte 1`},
		{"bad\xff", `it has a byte that is not UTF-8 ("\xff") at byte 3`},
		{"a\uFFFD", "it has U+FFFD, the replacement character, at byte 1"},
		{"zero\u200bwidth", `it has '\u200b' at byte 4`},
	}
	for _, tc := range tests {
		err := store.CheckLabel(tc.label)
		if tc.why == "" {
			if err != nil {
				t.Errorf("CheckLabel(%q) = %v; want nil", tc.label, err)
			}
			continue
		}
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != "label" || !strings.Contains(err.Error(), tc.why) || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CheckLabel(%q) = %v; want a *FieldError for label saying %q", tc.label, err, tc.why)
		}
		if strings.ContainsAny(err.Error(), "\x1b\a\t\n") {
			t.Errorf("CheckLabel(%q) = %q; want a message a terminal shows as it is", tc.label, err)
		}
	}
}
