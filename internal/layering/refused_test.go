package layering_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// refusedDirs are the packages whose refused input is one *FieldError
// (store.FieldError), never a message that wraps the sentinel.
var refusedDirs = []string{"store", "statestore", "pgstore", "mru", "internal/portrange", "portalloc"}

// notYetOneShape are files that still refuse input with a message
// wrapping the sentinel: the pools, sets, fleet-wide calls and metrics,
// which are moving to packages of their own. Each goes from this list as
// it is converted; an entry for a file that no longer exists is ignored.
var notYetOneShape = map[string]bool{
	"portalloc/pool.go":                        true,
	"portalloc/set.go":                         true,
	"portalloc/setspec.go":                     true,
	"portalloc/names.go":                       true,
	"portalloc/refs.go":                        true,
	"portalloc/manifest.go":                    true,
	"portalloc/stats.go":                       true,
	"portalloc/fleet.go":                       true,
	"portalloc/expvarmetrics/expvarmetrics.go": true,
}

// TestRefusedInputIsOneShape fails when the code of a package above
// refuses input with fmt.Errorf("%w: ...", ErrInvalidRequest) (or
// store.ErrInvalid, statestore.ErrInvalid, portrange.ErrInvalid): such an
// error names no field for errors.As to find. Refuse with a
// &store.FieldError{Field, Value, At, Want} instead. It fails too when
// code of portalloc but errors.go's opError writes portalloc's prefix.
func TestRefusedInputIsOneShape(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, dir := range refusedDirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if notYetOneShape[rel] {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			// portalloc's prefix is put on by opError, at the public call,
			// and by no code under it.
			inCore := filepath.ToSlash(filepath.Dir(rel)) == "portalloc" && filepath.Base(rel) != "errors.go"
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && inCore && lit.Kind == token.STRING && strings.HasPrefix(strings.Trim(lit.Value, "\"`"), "portalloc: ") {
					t.Errorf("%s: %s: portalloc's prefix is added once, by opError at the public call", fset.Position(lit.Pos()), lit.Value)
				}
				call, ok := n.(*ast.CallExpr)
				if !ok || !isCall(call, "fmt", "Errorf") {
					return true
				}
				for _, arg := range call.Args[1:] {
					if name := sentinelName(arg); name != "" {
						t.Errorf("%s: fmt.Errorf wraps %s: refuse input with a *store.FieldError naming the field, the value and what is accepted",
							fset.Position(call.Pos()), name)
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// isCall reports whether call is pkg.fn(...).
func isCall(call *ast.CallExpr, pkg, fn string) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != fn {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

// sentinelName returns the name of the sentinel of refused input that e
// is (ErrInvalidRequest, ErrInvalid, x.ErrInvalid...), or "".
func sentinelName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		if e.Name == "ErrInvalidRequest" || e.Name == "ErrInvalid" {
			return e.Name
		}
	case *ast.SelectorExpr:
		if e.Sel.Name == "ErrInvalidRequest" || e.Sel.Name == "ErrInvalid" {
			if x, ok := e.X.(*ast.Ident); ok {
				return x.Name + "." + e.Sel.Name
			}
			return e.Sel.Name
		}
	}
	return ""
}
