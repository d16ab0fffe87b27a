package portalloc_test

import (
	"github.com/berth-go/berth/portalloc/internal/testrig"
)

// This package's tests keep to its range in internal/testports: the other
// test binaries of go test ./... run at the same time with stores of their
// own. Allocators draw from allocRange unless a test sets another range
// (newAllocator sees to it), and ports a test picks itself (freeRun) come
// from pickRange, so a picked port is never one that an Allocator of the
// same test has handed out without binding it.
// pickRange is testrig.PickRange, allocRange testrig.AllocRange.
var allocRange = testrig.AllocRange
