package statestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/berth-go/berth/store"
)

func TestCheckLabel(t *testing.T) {
	for _, tt := range []struct {
		label string
		ok    bool
	}{
		{"", true},
		{"api.http", true},
		{"web server ü 東京", true},
		{strings.Repeat("x", store.MaxLabelLen), true},
		{strings.Repeat("x", store.MaxLabelLen+1), false},
		{"\x1b[31mred", false},
		{"\x1b]0;pwned\x07", false},
		{"a\nforged row", false},
		{"nul\x00", false},
		{"tab\t", false},
		{"\xff\xfe", false},
		{"del\x7f", false},
		{"bidi\u202e", false},
	} {
		err := store.CheckLabel(tt.label)
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CheckLabel(%q) = %v; want ok %v", tt.label, err, tt.ok)
		}
	}
}

// TestLabelRefusedEverywhere: a label that CheckLabel refuses is refused by
// every call that stores one, and nothing is written.
func TestLabelRefusedEverywhere(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	bad := "x\x1b[2J"
	_, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 30300), Label: bad})
	if !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Reserve with label %q = %v; want ErrInvalid", bad, err)
	}
	next := func() (uint16, bool) { return 30301, true }
	_, err = s.Scan(ctx, store.ScanRequest{Protocol: store.TCP, Addr: lo4, Label: bad, Next: next})
	if !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Scan with label %q = %v; want ErrInvalid", bad, err)
	}
	if err := s.Remember(ctx, bad, store.TCP, 30302); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Remember with label %q = %v; want ErrInvalid", bad, err)
	}
	if rs := list(t, s); len(rs) != 0 {
		t.Errorf("rows after refused calls: %v", rs)
	}
}

// TestStickyBounded: the store remembers at most MaxSticky labels; the
// least recently remembered are forgotten first.
func TestStickyBounded(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	// Most of the labels straight into the table, the last ones through
	// Remember, which prunes every so often.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const direct = store.MaxSticky + 1000
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := range direct {
		if _, err := tx.Exec("INSERT INTO sticky_ports (label, protocol, port, updated_at) VALUES (?, 'tcp', 30000, ?)", fmt.Sprintf("old-%d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if err := s.Remember(ctx, fmt.Sprintf("new-%d", i), store.TCP, 30001); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sticky_ports").Scan(&n); err != nil {
		t.Fatal(err)
	}
	// A prune ran at the 256th Remember: the bound holds then, and at
	// most the 44 remembered since exceed it.
	if n > store.MaxSticky+300-256 {
		t.Errorf("sticky_ports holds %d labels; want at most %d", n, store.MaxSticky+300-256)
	}
	for _, label := range []string{"new-0", "new-299"} {
		if _, ok, err := s.Recall(ctx, label, store.TCP); err != nil || !ok {
			t.Errorf("Recall(%s) = %v, %v; want the newest labels kept", label, ok, err)
		}
	}
	if _, ok, _ := s.Recall(ctx, "old-0", store.TCP); ok {
		t.Error("Recall(old-0) found it; want the least recently remembered forgotten")
	}
}

// FuzzCheckLabel: CheckLabel never panics, and what it accepts is within
// the documented limits.
func FuzzCheckLabel(f *testing.F) {
	for _, s := range []string{"", "api.http", "\x1b[31m", "ü", "\xff", strings.Repeat("a", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, label string) {
		if store.CheckLabel(label) != nil {
			return
		}
		if len(label) > store.MaxLabelLen || !utf8.ValidString(label) {
			t.Fatalf("CheckLabel accepted %q", label)
		}
		for _, r := range label {
			if unicode.IsControl(r) {
				t.Fatalf("CheckLabel accepted %q with control character %q", label, r)
			}
		}
	})
}
