package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-go/berth/store"
)

func TestParseRange(t *testing.T) {
	tests := []struct {
		in   string
		want store.Range
		err  string // substring of the error; "" for success
	}{
		{"20000-32767", store.Range{20000, 32767}, ""},
		{"1-65535", store.Range{1, 65535}, ""},
		{"25565", store.Range{25565, 25565}, ""},
		{"7-7", store.Range{7, 7}, ""},
		{"", store.Range{}, "empty"},
		{"abc", store.Range{}, "not a port number"},
		{"0-10", store.Range{}, "port 0"},
		{"0", store.Range{}, "port 0"},
		{"30000-20000", store.Range{}, "first port is above the last"},
		{"1-70000", store.Range{}, "above 65535"},
		{"99999999999999999999", store.Range{}, "above 65535"},
		{" 1-2", store.Range{}, "not a port number"},
		{"1-2 ", store.Range{}, "not a port number"},
		{"+1-2", store.Range{}, "not a port number"},
		{"-1-2", store.Range{}, "a port is missing"},
		{"1-", store.Range{}, "a port is missing"},
		{"1--2", store.Range{}, "not a port number"},
		{"1-2-3", store.Range{}, "not a port number"},
		{"0x10-0x20", store.Range{}, "not a port number"},
		{"１-２", store.Range{}, "not a port number"},
	}
	for _, tt := range tests {
		got, err := store.ParseRange(tt.in)
		if tt.err == "" {
			if err != nil || got != tt.want {
				t.Errorf("ParseRange(%q) = %v, %v; want %v, nil", tt.in, got, err, tt.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("ParseRange(%q) = %v, nil; want error containing %q", tt.in, got, tt.err)
			continue
		}
		var fe *store.FieldError
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), tt.in) ||
			!errors.As(err, &fe) || fe.Field != "port range" || fe.Value != tt.in || fe.Want == "" {
			t.Errorf("ParseRange(%q) error = %q; want a *store.FieldError for the port range %q wrapping ErrInvalid and saying %q", tt.in, err, tt.in, tt.err)
		}
	}
}

func TestParseRanges(t *testing.T) {
	got, err := store.ParseRanges("22000-22100,25565")
	if err != nil || len(got) != 2 || got[0] != (store.Range{22000, 22100}) || got[1] != (store.Range{25565, 25565}) {
		t.Errorf("ParseRanges = %v, %v", got, err)
	}
	if got, err := store.ParseRanges(""); err != nil || got != nil {
		t.Errorf("ParseRanges(\"\") = %v, %v; want nil, nil", got, err)
	}
	for bad, at := range map[string]string{",": `item 1 ""`, "1-2,": `item 2 ""`, "1-2,,3": `item 2 ""`, "1-2, 3": `item 2 " 3"`, "1-2,x": `item 2 "x"`} {
		_, err := store.ParseRanges(bad)
		var fe *store.FieldError
		if !errors.Is(err, store.ErrInvalid) || !errors.As(err, &fe) || fe.Value != bad || fe.At != at {
			t.Errorf("ParseRanges(%q) error = %v; want a *store.FieldError of the whole list at %s, wrapping ErrInvalid", bad, err, at)
		}
	}
}

// FuzzParseRange checks that ParseRange never panics, that what it accepts prints back
// to an equal range, and that ParseRanges agrees with it on single items.
func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"20000-32767", "25565", "0-10", " 1-2", "1-70000", "", "a-b", "1-2,3-4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := store.ParseRange(s)
		if err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("ParseRange(%q) error %v does not wrap store.ErrInvalid", s, err)
			}
			return
		}
		if r.Validate() != nil {
			t.Fatalf("ParseRange(%q) = %v, an invalid range", s, r)
		}
		back, err := store.ParseRange(r.String())
		if err != nil || back != r {
			t.Fatalf("ParseRange(%q) = %v; ParseRange(%q) = %v, %v", s, r, r.String(), back, err)
		}
		l, err := store.ParseRanges(s)
		if err != nil || len(l) != 1 || l[0] != r {
			t.Fatalf("ParseRanges(%q) = %v, %v; want [%v]", s, l, err, r)
		}
	})
}
