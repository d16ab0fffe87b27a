package portrange

import (
	"fmt"
	"os/exec"
)

func ephemeralRange() (Range, error) {
	out, err := exec.Command("netsh", "int", "ipv4", "show", "dynamicport", "tcp").Output()
	if err != nil {
		return IANADynamic, fmt.Errorf("portrange: netsh dynamicport: %w", err)
	}
	r, err := parseNetshDynamic(string(out))
	if err != nil {
		return IANADynamic, fmt.Errorf("portrange: %w", err)
	}
	return r, nil
}

// reservedRanges reads the ranges Hyper-V and WinNAT exclude for TCP and
// UDP. Binding in them fails with WSAEACCES.
func reservedRanges() ([]Range, error) {
	var all []Range
	for _, proto := range []string{"tcp", "udp"} {
		out, err := exec.Command("netsh", "int", "ipv4", "show", "excludedportrange", "protocol="+proto).Output()
		if err != nil {
			return all, fmt.Errorf("portrange: netsh excludedportrange: %w", err)
		}
		all = append(all, parseNetshExcluded(string(out))...)
	}
	return all, nil
}
