package portrange

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func ephemeralRange() (Range, error) {
	first, err := unix.SysctlUint32("net.inet.ip.portrange.first")
	if err != nil {
		return IANADynamic, fmt.Errorf("portrange: ephemeral range: %w", err)
	}
	last, err := unix.SysctlUint32("net.inet.ip.portrange.last")
	if err != nil {
		return IANADynamic, fmt.Errorf("portrange: ephemeral range: %w", err)
	}
	r := Range{First: uint16(first), Last: uint16(last)}
	if first > 65535 || last > 65535 || r.Size() == 0 {
		return IANADynamic, fmt.Errorf("portrange: ephemeral range %d-%d from sysctl is not a valid range", first, last)
	}
	return r, nil
}

func reservedRanges() ([]Range, error) { return nil, nil }
