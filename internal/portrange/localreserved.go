package portrange

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// LocalReservedFile is where Linux keeps net.ipv4.ip_local_reserved_ports:
// ports an administrator keeps for other software, which the kernel never
// picks as an ephemeral port and berth never hands out from a range.
const LocalReservedFile = "/proc/sys/net/ipv4/ip_local_reserved_ports"

// LocalReserved returns the ranges of net.ipv4.ip_local_reserved_ports,
// read afresh on every call (an administrator may change them at any
// time; the callers read them once per Allocator); nil where the OS has no
// such list.
func LocalReserved() ([]Range, error) {
	if runtime.GOOS != "linux" {
		return nil, nil
	}
	b, err := os.ReadFile(LocalReservedFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // a kernel without the sysctl (before 2.6.35), or no /proc
	}
	if err != nil {
		return nil, fmt.Errorf("portrange: %w", err)
	}
	return parseLocalReserved(string(b))
}

// parseLocalReserved parses the sysctl's value, such as "8080,9000-9100\n";
// an empty list is a newline alone.
func parseLocalReserved(s string) ([]Range, error) {
	var rs []Range
	if s = strings.TrimSpace(s); s == "" {
		return nil, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		r, err := parse(part)
		if err != nil {
			return nil, fmt.Errorf("portrange: %s: %w", LocalReservedFile, err)
		}
		rs = append(rs, r)
	}
	return rs, nil
}
