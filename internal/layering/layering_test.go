// Package layering_test fails when an import arrow points the wrong way:
// cmd and examples -> portalloc -> statestore, mru -> internal.
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
	case dir == "statestore" || dir == "mru":
		return 1
	case strings.HasPrefix(dir, "portalloc"):
		return 2
	default: // cmd, examples
		return 4
	}
}

// sameFamily reports whether a and b are portalloc and one of its
// subpackages (portalloc/porttest builds on portalloc).
func sameFamily(a, b string) bool {
	return strings.HasPrefix(a, "portalloc") && strings.HasPrefix(b, "portalloc")
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
			if strings.HasPrefix(dep, "cmd/") || strings.HasPrefix(dep, "examples/") {
				t.Errorf("%s imports %s: nothing imports cmd or examples", rel, p)
			} else if layer(dep) >= layer(rel) && !strings.HasPrefix(dep, rel+"/") && !sameFamily(dep, rel) {
				t.Errorf("%s imports %s: imports flow cmd, examples -> portalloc -> statestore, mru -> internal", rel, p)
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
