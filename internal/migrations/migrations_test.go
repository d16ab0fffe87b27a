package migrations

import (
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
