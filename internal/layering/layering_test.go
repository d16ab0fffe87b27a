// Package layering_test fails when an import arrow points the wrong way:
// cmd and examples -> portalloc/fleet -> portalloc's layers (portset,
// pool, expvarmetrics, listenfd, who) -> portalloc, the dispatcher ->
// statestore, pgstore -> store -> internal, with portlock (a module of its
// own) usable from every layer; and when a package that must not link a
// PostgreSQL client (portalloc, statestore, ...) does.
package layering_test

import (
	"errors"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/berth-go/berth/"

// flow says which way imports flow, for messages.
const flow = "imports flow cmd, examples -> portalloc/fleet -> portalloc's layers -> portalloc -> statestore, pgstore -> store -> internal"

// layer returns the rank of a package directory relative to the module
// root: a package may import only packages of a lower rank.
func layer(dir string) int {
	switch {
	case dir != "internal/mru" && strings.HasPrefix(dir, "internal/"), dir == "portlock", strings.HasPrefix(dir, "portlock/"):
		return 0 // leaves; portlock is a module of its own that requires nothing
	case dir == "store" || strings.HasPrefix(dir, "store/"):
		return 1 // the boundary every store implements, and its conformance suite
	case dir == "statestore" || dir == "pgstore" || dir == "internal/mru":
		return 2 // the stores, and the fallback backend beside them
	case dir == fleetPackage:
		return 5 // opens a fleet's store (pgstore) and hands it to portalloc
	case dir == "portalloc" || strings.HasPrefix(dir, "portalloc/internal/"):
		return 3 // the dispatcher, and what only it and its tests use
	case strings.HasPrefix(dir, "portalloc/"):
		return 4 // a layer, built on the dispatcher's exported API
	default: // cmd, examples
		return 6
	}
}

// fleetPackage is the one package of the portalloc family that imports a
// store of a fleet (pgstore): programs import it when they want one.
const fleetPackage = "portalloc/fleet"

// drivers are the stores that link a client library: only the programs
// (cmd, examples), fleetPackage and tests import them, as a program links
// database/sql's drivers only when it asks for them.
var drivers = map[string]bool{"pgstore": true}

// sameFamily reports whether a and b are a package and one of its
// subpackages (portalloc's layers build on portalloc, store/storetest on
// store).
func sameFamily(a, b string) bool {
	for _, top := range []string{"portalloc", "store", "portlock"} {
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
// themselves but internal leaves (internal/pgcluster drives the servers of
// internal/pgserver), so no arrow through them can point up;
// internal/testproc imports only the standard library
// (TestTestprocImportsStandardLibrary).
var testHelpers = map[string]bool{
	"internal/testproc":  true,
	"internal/testports": true,
	"internal/pgcluster": true,
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
			} else if testHelpers[rel] && strings.HasPrefix(dep, "internal/") && (!testHelpers[dep] || dep == "internal/testproc") {
				continue // a test helper on an internal leaf, or on testproc (the standard library's only): nothing points up
			} else if test && dep == fleetPackage && sameFamily(dep, rel) {
				continue // portalloc's external tests open fleets' stores through it
			} else if drivers[dep] && layer(rel) == layer("portalloc") && !test {
				t.Errorf("%s imports %s: portalloc and its packages reach a fleet's store only through package store's interfaces; %s opens it", rel, p, fleetPackage)
			} else if layer(dep) > layer(rel) && !test {
				t.Errorf("%s imports %s: %s; the dispatcher reaches no layer", rel, p, flow)
			} else if layer(dep) > layer(rel) && !sameFamily(dep, rel) {
				t.Errorf("%s imports %s: %s", rel, p, flow)
			} else if layer(dep) == layer(rel) && !strings.HasPrefix(dep, rel+"/") && !sameFamily(dep, rel) {
				t.Errorf("%s imports %s: %s", rel, p, flow)
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

// noPostgres are the packages that must not link a PostgreSQL client:
// every program that gives tests their ports, or keeps one host's
// reservations, imports them.
var noPostgres = []string{"portalloc", "portalloc/pool", "portalloc/portset", "portalloc/listenfd", "portalloc/who", "portalloc/expvarmetrics", "statestore", "store", "store/storetest", "internal/mru"}

// postgresModules are the import path prefixes of a PostgreSQL client and
// of what it brings.
var postgresModules = []string{
	"github.com/jackc/", // pgx, pgxpool, puddle, pgerrcode, pgpassfile, pgservicefile
	"github.com/golang-migrate/migrate/v4/database/pgx", // golang-migrate's pgx driver
	"github.com/golang-migrate/migrate/v4/database/postgres",
	"github.com/lib/pq",
}

// TestNoPostgresClientBelowFleet: go list -deps of portalloc,
// statestore and the other packages of one host names no package of a
// PostgreSQL client: only programs that import pgstore or portalloc/fleet
// build and link pgx. TestFleetLinksPostgres checks that the test can
// fail.
func TestNoPostgresClientBelowFleet(t *testing.T) {
	for _, pkg := range noPostgres {
		if bad := postgresDeps(t, pkg); len(bad) > 0 {
			t.Errorf("go list -deps ./%s names %s: it links a PostgreSQL client; reach pgstore through package store's interfaces and open it in %s", pkg, strings.Join(bad, ", "), fleetPackage)
		}
	}
}

// TestFleetLinksPostgres: the packages that open a fleet's store do link
// pgx, so that TestNoPostgresClientBelowFleet's go list would see it.
func TestFleetLinksPostgres(t *testing.T) {
	for _, pkg := range []string{fleetPackage, "pgstore"} {
		bad := postgresDeps(t, pkg)
		for _, want := range []string{"github.com/jackc/pgx/v5", "github.com/jackc/puddle/v2", "github.com/jackc/pgerrcode", "github.com/golang-migrate/migrate/v4/database/pgx/v5"} {
			if !slices.Contains(bad, want) {
				t.Errorf("go list -deps ./%s = %v; want it to name %s", pkg, bad, want)
			}
		}
	}
}

// postgresDeps returns the dependencies of the module's package pkg that
// belong to a PostgreSQL client, as go list -deps names them. It skips the
// test when the go command is not on PATH.
func postgresDeps(tb testing.TB, pkg string) []string {
	tb.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		tb.Skipf("go list needs the go command, which is not on PATH: %v", err)
	}
	cmd := exec.Command(goCmd, "list", "-deps", "./"+pkg)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			tb.Fatalf("go list -deps ./%s: %v\n%s", pkg, err, ee.Stderr)
		}
		tb.Fatalf("go list -deps ./%s: %v", pkg, err)
	}
	var bad []string
	for _, dep := range strings.Fields(string(out)) {
		for _, m := range postgresModules {
			if strings.HasPrefix(dep, m) {
				bad = append(bad, dep)
				break
			}
		}
	}
	return bad
}

// TestLayer: the ranks TestImportDirection checks arrows against put the
// dispatcher below its layers, and those below the package that opens
// a fleet's store and the programs.
func TestLayer(t *testing.T) {
	order := [][]string{
		{"internal/portrange", "portlock", "portlock/porttest"},
		{"store", "store/storetest"},
		{"statestore", "pgstore", "internal/mru"},
		{"portalloc", "portalloc/internal/names"},
		{"portalloc/pool", "portalloc/portset", "portalloc/expvarmetrics", "portalloc/listenfd", "portalloc/who"},
		{fleetPackage},
		{"cmd/berth", "examples/fleet"},
	}
	for i, rank := range order {
		for _, dir := range rank {
			if got, want := layer(dir), layer(order[i][0]); got != want {
				t.Errorf("layer(%q) = %d; want %d, the rank of %q", dir, got, want, order[i][0])
			}
			if i > 0 {
				if below := order[i-1][0]; layer(below) >= layer(dir) {
					t.Errorf("layer(%q) = %d; want it above layer(%q) = %d", dir, layer(dir), below, layer(below))
				}
			}
		}
	}
}
