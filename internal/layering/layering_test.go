// Package layering_test fails when an import arrow points the wrong way:
// cmd and examples -> portalloc -> statestore, pgstore, mru -> store -> internal.
package layering_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/berth-go/berth/"

// layer returns the rank of a package directory relative to the module
// root: a package may import only packages of a lower rank.
func layer(dir string) int {
	switch {
	case strings.HasPrefix(dir, "internal/"):
		return 0
	case dir == "store" || strings.HasPrefix(dir, "store/"):
		return 1 // the boundary every store implements, and its conformance suite
	case dir == "statestore" || dir == "pgstore" || dir == "mru":
		return 2
	case strings.HasPrefix(dir, "portalloc"):
		return 3
	default: // cmd, examples
		return 4
	}
}

// sameFamily reports whether a and b are a package and one of its
// subpackages (portalloc/porttest builds on portalloc, store/storetest on
// store).
func sameFamily(a, b string) bool {
	for _, top := range []string{"portalloc", "store"} {
		if (a == top || strings.HasPrefix(a, top+"/")) && (b == top || strings.HasPrefix(b, top+"/")) {
			return true
		}
	}
	return false
}

// testHelpers are the internal packages that serve tests only. The tests
// of any package may import them, those of other internal packages
// included: what must stay a leaf is the code a package ships, not its
// tests. Being internal packages, they import no package of the module
// themselves, so no arrow through them can point up; internal/testproc
// imports only the standard library (TestTestprocImportsStandardLibrary).
var testHelpers = map[string]bool{
	"internal/testproc":  true,
	"internal/testports": true,
}

func TestImportDirection(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			dep, ok := strings.CutPrefix(p, module)
			if !ok || dep == rel {
				continue
			}
			test := strings.HasSuffix(path, "_test.go")
			if strings.HasPrefix(dep, "cmd/") || strings.HasPrefix(dep, "examples/") {
				t.Errorf("%s imports %s: nothing imports cmd or examples", rel, p)
			} else if test && testHelpers[dep] {
				continue // test code may use them at every layer, internal/ included
			} else if layer(dep) >= layer(rel) && !strings.HasPrefix(dep, rel+"/") && !sameFamily(dep, rel) {
				t.Errorf("%s imports %s: imports flow cmd, examples -> portalloc -> statestore, mru -> store -> internal", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
}

// TestTestprocImportsStandardLibrary: internal/testproc, which the tests of
// every layer import, imports nothing but the standard library.
func TestTestprocImportsStandardLibrary(t *testing.T) {
	files, err := filepath.Glob("../testproc/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in internal/testproc (%v)", err)
	}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s; internal/testproc imports only the standard library", filepath.Base(path), p)
			}
		}
	}
}
