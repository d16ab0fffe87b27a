package portlock

import (
	"net/netip"
	"strconv"
)

// prefix starts the name of every lock. The number is the version of the
// naming scheme: berths that name locks differently must not share it.
const prefix = "berth/1/"

// name is the abstract name of a lock of key: the address's own, "*" for
// both wildcards, or "s<i>" for slot i.
func name(network string, port uint16, tag string) string {
	return prefix + network + "/" + strconv.Itoa(int(port)) + "/" + tag
}

func addrTag(a netip.Addr) string {
	if a.IsUnspecified() {
		return "*"
	}
	return a.String()
}

func slotTag(i int) string { return "s" + strconv.Itoa(i) }
