package testports_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testports"
)

// TestDisjoint: no two packages share a port, and every range lies below
// the Linux ephemeral range.
func TestDisjoint(t *testing.T) {
	for i, a := range testports.All {
		if a.Range.First < 1024 || a.Range.First > a.Range.Last || a.Range.Last >= 32768 {
			t.Errorf("%s: range %v; want FIRST <= LAST within 1024-32767", a.Package, a.Range)
		}
		for _, b := range testports.All[i+1:] {
			if a.Range.First <= b.Range.Last && b.Range.First <= a.Range.Last {
				t.Errorf("%s %v and %s %v overlap: two packages' private stores could hand out the same port", a.Package, a.Range, b.Package, b.Range)
			}
			if a.Package == b.Package {
				t.Errorf("%s has two ranges", a.Package)
			}
		}
	}
}

// TestAllListsEveryRange: each Range variable of the package is in All, so
// TestDisjoint checks it.
func TestAllListsEveryRange(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "testports.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[testports.Range]bool{}
	for _, e := range testports.All {
		listed[e.Range] = true
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		spec, ok := node.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range spec.Names {
			if i >= len(spec.Values) {
				continue
			}
			lit, ok := spec.Values[i].(*ast.CompositeLit)
			if !ok {
				continue
			}
			if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != "Range" {
				continue
			}
			var r testports.Range
			for _, el := range lit.Elts {
				kv := el.(*ast.KeyValueExpr)
				v, _ := strconv.ParseUint(kv.Value.(*ast.BasicLit).Value, 10, 16)
				switch kv.Key.(*ast.Ident).Name {
				case "First":
					r.First = uint16(v)
				case "Last":
					r.Last = uint16(v)
				}
			}
			n++
			if !listed[r] {
				t.Errorf("testports.%s (%v) is not in All", name.Name, r)
			}
		}
		return true
	})
	if n != len(testports.All) {
		t.Errorf("%d Range variables, %d entries in All", n, len(testports.All))
	}
}

// TestAllNamesPackages: every entry of All names a package of the module,
// so a package that moves takes its range along instead of leaving a stale
// name behind.
func TestAllNamesPackages(t *testing.T) {
	for _, e := range testports.All {
		files, err := filepath.Glob(filepath.Join("..", "..", filepath.FromSlash(e.Package), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Errorf("testports.All lists %s (%v), which has no Go files: update the entry where the package now lives", e.Package, e.Range)
		}
	}
}

// TestBelowThisHostsEphemeralRange: the kernel hands out ports of its
// ephemeral range to outgoing connections and binds to port 0, which other
// tests make all the time; a test range inside it would lose ports to them.
func TestBelowThisHostsEphemeralRange(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the Linux ephemeral range")
	}
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	f := strings.Fields(string(b))
	first, err1 := strconv.Atoi(f[0])
	last, err2 := strconv.Atoi(f[len(f)-1])
	if err1 != nil || err2 != nil {
		t.Fatalf("ip_local_port_range %q", b)
	}
	for _, e := range testports.All {
		if int(e.Range.First) <= last && first <= int(e.Range.Last) {
			t.Errorf("%s %v overlaps this host's ephemeral range %d-%d (net.ipv4.ip_local_port_range)", e.Package, e.Range, first, last)
		}
	}
}

// TestPorttestKeepsToItsRange: portlock/porttest lives in a module of its
// own and cannot import this package; its tests name their range in a
// constant, which must be Porttest.
func TestPorttestKeepsToItsRange(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "portlock", "porttest", "porttest_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "const testRange = " + strconv.Quote(testports.Porttest.String()); !strings.Contains(string(src), want) {
		t.Errorf("portlock/porttest's tests do not say %s: they would lock ports of other packages' ranges", want)
	}
}
