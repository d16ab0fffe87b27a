package owner

import (
	"os"
	"strings"
	"sync"
)

// scope returns "<boot id>/<pid namespace>" for this process, or "" when
// neither can be read (a restricted /proc).
var scope = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	boot := strings.TrimSpace(string(b))
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return boot
	}
	// "pid:[4026531836]" -> "4026531836"
	ns = strings.TrimSuffix(strings.TrimPrefix(ns, "pid:["), "]")
	return boot + "/" + ns
})
