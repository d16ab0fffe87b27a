package portset

import (
	"strconv"
	"strings"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// specField is the Field of every refused spec: At says where in it.
const specField = "SetSpec"

// refuse is the error of the value of a spec at the path at, with what is
// accepted there.
func refuse(at, value, want string) error {
	return &store.FieldError{Field: specField, Value: value, At: at, Want: want}
}

// portList writes ports as a spec's JSON list would hold them: "3000,3001".
func portList(ports []uint16) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

// opError is the error of a public call of the package: err in a
// *portalloc.OpError for op, the one place the package's calls add the
// prefix. nil stays nil.
func opError(op string, err error) error {
	if err == nil {
		return nil
	}
	// An error of the Allocator's has its prefix already: one is enough.
	if oe, ok := err.(*portalloc.OpError); ok { //nolint:errorlint // only an OpError at the top, not one wrapped deeper
		err = oe.Err
	}
	return &portalloc.OpError{Op: op, Err: err}
}
