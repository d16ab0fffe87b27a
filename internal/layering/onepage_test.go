package layering

import (
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
)

// maxCoreDecls is the most exported declarations portalloc's go doc may
// list, methods included (a const or var block counts once, as go doc
// shows it): the core reads on one page, and each further concept lives in
// a package of its own.
const maxCoreDecls = 50

// TestCoreReadsOnOnePage counts what `go doc -all ./portalloc` lists.
func TestCoreReadsOnOnePage(t *testing.T) {
	dir, err := filepath.Abs("../../portalloc")
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := build.Default.ImportDir(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, pkg.ImportPath)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range append(p.Consts, p.Vars...) {
		names = append(names, v.Names[0])
	}
	for _, f := range p.Funcs {
		names = append(names, f.Name)
	}
	for _, ty := range p.Types {
		names = append(names, ty.Name)
		for _, v := range append(ty.Consts, ty.Vars...) {
			names = append(names, v.Names[0])
		}
		for _, f := range ty.Funcs {
			names = append(names, f.Name)
		}
		for _, m := range ty.Methods {
			names = append(names, ty.Name+"."+m.Name)
		}
	}
	if len(names) > maxCoreDecls {
		t.Errorf("portalloc's go doc lists %d exported declarations; at most %d keep the core on one page. Move a concept to its own package. They are: %v", len(names), maxCoreDecls, names)
	}
	if len(names) < 20 {
		t.Errorf("counted only %d declarations in portalloc (%v): the count is broken", len(names), names)
	}
}
