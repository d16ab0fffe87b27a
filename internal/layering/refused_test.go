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
var refusedDirs = []string{"store", "statestore", "pgstore", "internal/mru", "internal/portrange", "portalloc"}

// TestRefusedInputIsOneShape fails when the code of a package above
// refuses input with fmt.Errorf("%w: ...", ErrInvalidRequest) (or
// store.ErrInvalid, statestore.ErrInvalid, portrange.ErrInvalid): such an
// error names no field for errors.As to find. Refuse with a
// &store.FieldError{Field, Value, At, Want} instead. It fails too when
// code of portalloc or of its packages (pool, portset, fleet...) but
// portalloc's errors.go writes portalloc's prefix, or writes a prefix of
// its own package ("pool: "): the prefix is added once, by a
// *portalloc.OpError at the public call, and each package builds its
// OpErrors in one helper.
func TestRefusedInputIsOneShape(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	// opErrorAt lists, by package directory, where an OpError is built.
	opErrorAt := map[string][]string{}
	layers := layerPackages(t, root)
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
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			// portalloc's prefix is put on by an OpError at the public
			// call, and by no code under it; the layers over an
			// Allocator put on none of their own.
			pkgDir := filepath.ToSlash(filepath.Dir(rel))
			overAllocator := pkgDir == "portalloc" || layers[pkgDir]
			ownPrefix := f.Name.Name + ": "
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && overAllocator && rel != "portalloc/errors.go" && lit.Kind == token.STRING {
					v := strings.Trim(lit.Value, "\"`")
					if strings.HasPrefix(v, "portalloc: ") || (pkgDir != "portalloc" && strings.HasPrefix(v, ownPrefix)) {
						t.Errorf("%s: %s: the prefix is added once, by a *portalloc.OpError at the public call", fset.Position(lit.Pos()), lit.Value)
					}
				}
				if fn, ok := n.(*ast.FuncDecl); ok && overAllocator && buildsOpError(fn) {
					opErrorAt[pkgDir] = append(opErrorAt[pkgDir], fset.Position(fn.Pos()).String()+" "+fn.Name.Name)
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
	for dir, at := range opErrorAt {
		if len(at) > 1 {
			t.Errorf("%s builds a *portalloc.OpError in %d functions (%s); want one helper, opError, that every public call uses", dir, len(at), strings.Join(at, ", "))
		}
	}
	if len(opErrorAt) < 5 {
		t.Errorf("OpErrors are built in %d packages (%v); want one helper in portalloc and in each of its packages that refuses input", len(opErrorAt), opErrorAt)
	}
}

// layerPackages returns the directories (relative to root, slashed) of
// portalloc's layers: the packages under portalloc/ whose code imports
// portalloc.
func layerPackages(t *testing.T, root string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, "portalloc"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if strings.Trim(imp.Path.Value, `"`) == "github.com/berth-go/berth/portalloc" {
				rel, _ := filepath.Rel(root, filepath.Dir(path))
				out[filepath.ToSlash(rel)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// buildsOpError reports whether fn writes an OpError literal,
// &OpError{...} or &portalloc.OpError{...}.
func buildsOpError(fn *ast.FuncDecl) bool {
	found := false
	ast.Inspect(fn, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		switch t := lit.Type.(type) {
		case *ast.Ident:
			found = found || t.Name == "OpError"
		case *ast.SelectorExpr:
			found = found || t.Sel.Name == "OpError"
		}
		return true
	})
	return found
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
