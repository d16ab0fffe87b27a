package portrange

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// IANADynamic is the dynamic port range that Windows and macOS use by
// default, and the answer where the OS range cannot be read.
var IANADynamic = Range{First: 49152, Last: 65535}

var ephemeral = sync.OnceValues(ephemeralRange)

// Ephemeral returns the range the OS picks outgoing connections' local ports
// from. It is read once per process. On an error it returns IANADynamic too,
// so callers that only warn can go on.
func Ephemeral() (Range, error) { return ephemeral() }

var reserved = sync.OnceValues(reservedRanges)

// ReservedByOS returns ranges the OS keeps for itself and refuses to bind
// (on Windows, the excluded port ranges of Hyper-V and WinNAT); nil
// elsewhere. It is read once per process.
func ReservedByOS() ([]Range, error) { return reserved() }

// parseLinux parses /proc/sys/net/ipv4/ip_local_port_range: "32768\t60999".
func parseLinux(s string) (Range, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return Range{}, fmt.Errorf("ip_local_port_range %q: want two numbers", s)
	}
	return parse(f[0] + "-" + f[1])
}

// parseNetshDynamic parses `netsh int ipv4 show dynamicport tcp`:
//
//	Protocol tcp Dynamic Port Range
//	---------------------------------
//	Start Port      : 49152
//	Number of Ports : 16384
func parseNetshDynamic(out string) (Range, error) {
	var start, count int
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			continue
		}
		switch k = strings.ToLower(strings.TrimSpace(k)); {
		case strings.HasPrefix(k, "start"):
			start = n
		case strings.HasPrefix(k, "number"):
			count = n
		}
	}
	if start < 1 || count < 1 || start+count-1 > 65535 {
		return Range{}, fmt.Errorf("netsh dynamic port range: start %d, %d ports: not a valid range", start, count)
	}
	return Range{First: uint16(start), Last: uint16(start + count - 1)}, nil
}

// parseNetshExcluded parses `netsh int ipv4 show excludedportrange
// protocol=tcp`, whose data lines hold a start and an end port, and a "*"
// for administered exclusions:
//
//	Start Port    End Port
//	----------    --------
//	     50000       50059     *
func parseNetshExcluded(out string) []Range {
	var rs []Range
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		if r, err := parse(f[0] + "-" + f[1]); err == nil {
			rs = append(rs, r)
		}
	}
	return rs
}
