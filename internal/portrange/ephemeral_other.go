//go:build !darwin && !windows

package portrange

import (
	"fmt"
	"os"
	"runtime"
)

func ephemeralRange() (Range, error) {
	if runtime.GOOS != "linux" {
		return IANADynamic, nil
	}
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return IANADynamic, fmt.Errorf("portrange: ephemeral range: %w", err)
	}
	r, err := parseLinux(string(b))
	if err != nil {
		return IANADynamic, fmt.Errorf("portrange: ephemeral range: %w", err)
	}
	return r, nil
}

func reservedRanges() ([]Range, error) { return nil, nil }
