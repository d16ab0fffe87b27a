package sockets

import (
	"net/netip"
	"testing"
)

func TestParseTable(t *testing.T) {
	tcp := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5DC0 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:5DC0 0100007F:A000 01 00000000:00000000 00:00000000 00000000  1000        0 4243 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 17 1 0000000000000000 100 0 0 10 0
`)
	got, err := parseTable("tcp", tcp, func(p uint16) bool { return p == 24000 })
	if err != nil {
		t.Fatal(err)
	}
	want := []Socket{
		{"tcp", netip.MustParseAddrPort("127.0.0.1:24000"), netip.MustParseAddrPort("0.0.0.0:0"), "LISTEN", 1000, 4242},
		{"tcp", netip.MustParseAddrPort("127.0.0.1:24000"), netip.MustParseAddrPort("127.0.0.1:40960"), "ESTABLISHED", 1000, 4243},
	}
	if len(got) != len(want) {
		t.Fatalf("parseTable = %+v; want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("parseTable row %d = %+v; want %+v", i, got[i], want[i])
		}
	}
	udp6 := []byte(`  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  5: 00000000000000000000000001000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 99 2 0000000000000000 0
`)
	got, err = parseTable("udp", udp6, nil)
	if err != nil || len(got) != 1 {
		t.Fatalf("parseTable(udp6) = %+v, %v", got, err)
	}
	if w := (Socket{"udp", netip.MustParseAddrPort("[::1]:53"), netip.MustParseAddrPort("[::]:0"), "UNCONN", 101, 99}); got[0] != w {
		t.Errorf("parseTable(udp6) = %+v; want %+v", got[0], w)
	}
	for _, bad := range []string{
		"h\n 0: 0100007F:5DC0 00000000:0000 0A\n",
		"h\n 0: 0100007G:5DC0 00000000:0000 0A 0:0 0:0 0 0 0 1\n",
		"h\n 0: 0100007F 00000000:0000 0A 0:0 0:0 0 0 0 1\n",
		"h\n 0: 0100007F:5DC0 00000000:0000 0A 0:0 0:0 0 x 0 1\n",
	} {
		if got, err := parseTable("tcp", []byte(bad), nil); err == nil {
			t.Errorf("parseTable(%q) = %+v, nil; want an error", bad, got)
		}
	}
}
