package portrange

import (
	"reflect"
	"testing"
)

func TestParseLocalReserved(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Range
	}{
		{"\n", nil},
		{"8080\n", []Range{{8080, 8080}}},
		{"8080,9000-9100\n", []Range{{8080, 8080}, {9000, 9100}}},
	} {
		got, err := parseLocalReserved(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseLocalReserved(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if got, err := parseLocalReserved("8080,x\n"); err == nil {
		t.Errorf("parseLocalReserved(%q) = %v, nil; want an error", "8080,x\n", got)
	}
}
