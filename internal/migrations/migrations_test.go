package migrations

import (
	"io/fs"
	"maps"
	"strings"
	"testing"
	"testing/fstest"
)

func TestLatest(t *testing.T) {
	for _, tc := range []struct {
		files []string
		want  uint
	}{
		{nil, 0},
		{[]string{"1_a.up.sql", "1_a.down.sql", "2_b.up.sql", "10_c.up.sql", "10_c.down.sql"}, 10},
		{[]string{"README.md", "x_y.up.sql", "3_z.up.sql", "-1_neg.up.sql"}, 3},
	} {
		fsys := fstest.MapFS{}
		for _, f := range tc.files {
			fsys["m/"+f] = &fstest.MapFile{}
		}
		if got := Latest(fsys, "m"); got != tc.want {
			t.Errorf("Latest(%v) = %d; want %d", tc.files, got, tc.want)
		}
	}
}

func TestWriteVersions(t *testing.T) {
	up := func(w string) *fstest.MapFile {
		if w == "" {
			return &fstest.MapFile{Data: []byte("CREATE TABLE t (x);\n")}
		}
		return &fstest.MapFile{Data: []byte("-- write-version: " + w + "\n-- why\nCREATE TABLE t (x);\n")}
	}
	for _, tc := range []struct {
		name    string
		files   map[string]*fstest.MapFile
		want    map[uint]uint
		wantErr string
	}{
		{"before compat", map[string]*fstest.MapFile{"1_a.up.sql": up(""), "5_e.up.sql": up("")}, map[uint]uint{1: 0, 5: 0}, ""},
		{"tolerated and not", map[string]*fstest.MapFile{"5_e.up.sql": up(""), "6_f.up.sql": up("1"), "7_g.up.sql": up("1"), "8_h.up.sql": up("2"), "8_h.down.sql": up("")},
			map[uint]uint{5: 0, 6: 1, 7: 1, 8: 2}, ""},
		{"undeclared", map[string]*fstest.MapFile{"6_f.up.sql": up("1"), "7_g.up.sql": up("")}, nil, "7_g.up.sql declares no write version"},
		{"jump", map[string]*fstest.MapFile{"6_f.up.sql": up("1"), "7_g.up.sql": up("3")}, nil, "7_g.up.sql declares write version 3 after 1"},
		{"down", map[string]*fstest.MapFile{"6_f.up.sql": up("2"), "7_g.up.sql": up("1")}, nil, "7_g.up.sql declares write version 1 after 2"},
		{"zero", map[string]*fstest.MapFile{"6_f.up.sql": up("0")}, nil, "6_f.up.sql declares write version 0"},
		{"not a number", map[string]*fstest.MapFile{"6_f.up.sql": up("one")}, nil, "6_f.up.sql declares no write version"},
	} {
		fsys := fstest.MapFS{}
		for name, f := range tc.files {
			fsys["m/"+name] = f
		}
		got, err := WriteVersions(fsys, "m")
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: WriteVersions = %v, %v; want an error containing %q", tc.name, got, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || !maps.Equal(got, tc.want)):
			t.Errorf("%s: WriteVersions = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestSourceOverlay(t *testing.T) {
	own := fstest.MapFS{"m/1_a.up.sql": {}, "m/1_a.down.sql": {}}
	extra := fstest.MapFS{"m/2_b.up.sql": {Data: []byte("x")}}
	if got := Latest(Source("t", own, "m"), "m"); got != 1 {
		t.Errorf("Latest without an overlay = %d; want 1", got)
	}
	SetOverlay("t", extra)
	defer SetOverlay("t", nil)
	src := Source("t", own, "m")
	if got := Latest(src, "m"); got != 2 {
		t.Errorf("Latest with an overlay = %d; want 2", got)
	}
	if b, err := fs.ReadFile(src, "m/2_b.up.sql"); err != nil || string(b) != "x" {
		t.Errorf("ReadFile of the overlay's file = %q, %v; want \"x\"", b, err)
	}
	if got := Latest(Source("other", own, "m"), "m"); got != 1 {
		t.Errorf("Latest of another store = %d; want 1", got)
	}
}
