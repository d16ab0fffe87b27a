// Package readme checks berth's docs (README.md, CONTRIBUTING.md and the
// guides in docs/): the Go in them compiles, so a reader who copies a
// snippet gets code that builds, handles its errors and releases what it
// takes; and every relative link leads to a file that exists and, with a
// #fragment, to one of its headings; and the README's test command is the
// one CI runs.
package readme

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// snippet is one ```go block of a markdown file.
type snippet struct {
	file string // the markdown file, relative to the module's root
	line int    // of its first line of code
	code string
}

// snippets returns the ```go blocks of the markdown file rel under root.
func snippets(tb testing.TB, root, rel string) []snippet {
	tb.Helper()
	path := filepath.Join(root, rel)
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var (
		out []snippet
		cur *snippet
		n   int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &snippet{file: rel, line: n + 1}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	if cur != nil {
		tb.Fatalf("%s:%d: a ```go block that never ends", path, cur.line-1)
	}
	return out
}

// known are the packages a fragment may use by their usual names; a
// fragment imports those it names.
var known = map[string]string{
	"errors": "errors", "fmt": "fmt", "io": "io", "log": "log", "net": "net",
	"http": "net/http", "httptest": "net/http/httptest", "os": "os", "exec": "os/exec",
	"signal": "os/signal", "syscall": "syscall", "time": "time", "slog": "log/slog",
	"strings": "strings", "strconv": "strconv", "testing": "testing",
	"logr":      "github.com/go-logr/logr",
	"listenfd":  "github.com/berth-go/berth/portalloc/listenfd",
	"porttest":  "github.com/berth-go/berth/portlock/porttest",
	"portlock":  "github.com/berth-go/berth/portlock",
	"store":     "github.com/berth-go/berth/store",
	"pgstore":   "github.com/berth-go/berth/pgstore",
	"portalloc": "github.com/berth-go/berth/portalloc",
	"fleet":     "github.com/berth-go/berth/portalloc/fleet",
	"pool":      "github.com/berth-go/berth/portalloc/pool",
	"portset":   "github.com/berth-go/berth/portalloc/portset",
	"who":       "github.com/berth-go/berth/portalloc/who",
}

var selector = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Z]`)

// source is the Go file a snippet is checked as. A snippet that starts with
// a package clause is a file of its own; any other is the body of a
// function given ctx and an Allocator a, which returns an error: it must
// use what it declares and handle its errors. Its imports are those of
// known that it names. A line directive makes the
// compiler's messages point into the markdown file.
func (s snippet) source() string {
	directive := fmt.Sprintf("//line %s:%d\n", filepath.ToSlash(s.file), s.line)
	if strings.HasPrefix(s.code, "package ") {
		return directive + s.code
	}
	imports := []string{"context", known["portalloc"]}
	for _, m := range selector.FindAllStringSubmatch(s.code, -1) {
		if p, ok := known[m[1]]; ok && !slices.Contains(imports, p) {
			imports = append(imports, p)
		}
	}
	var b strings.Builder
	b.WriteString("package snippet\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&b, "\t%q\n", p)
	}
	// The inner block lets a fragment declare an a of its own.
	b.WriteString(")\n\nfunc snippet(ctx context.Context, a *portalloc.Allocator) error {\n{\n")
	b.WriteString(directive + s.code)
	b.WriteString("}\n\treturn nil\n}\n")
	return b.String()
}

// docs returns the markdown files of berth's docs, relative to root:
// README.md, CONTRIBUTING.md and docs/*.md. BENCHMARKS.md holds a table
// of figures and no guide, and is only a link target.
func docs(tb testing.TB, root string) []string {
	tb.Helper()
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		tb.Fatal(err)
	}
	if len(guides) == 0 {
		tb.Fatal("docs/ has no guide; want the guides the README links to")
	}
	files := []string{"README.md", "CONTRIBUTING.md"}
	for _, g := range guides {
		rel, err := filepath.Rel(root, g)
		if err != nil {
			tb.Fatal(err)
		}
		files = append(files, rel)
	}
	return files
}

// TestSnippetsCompile builds every ```go block of README.md and docs/*.md
// against the module's packages, each as a package of its own that exists
// only in a build overlay, so nothing is written to the source tree.
func TestSnippetsCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("needs the go command: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(snippets(t, root, "README.md")) == 0 {
		t.Fatal("README.md has no ```go block; want the quickstart at least")
	}
	var ss []snippet
	for _, f := range docs(t, root) {
		ss = append(ss, snippets(t, root, f)...)
	}
	tmp := t.TempDir()
	overlay := map[string]map[string]string{"Replace": {}}
	var pkgs []string
	for i, s := range ss {
		src := filepath.Join(tmp, fmt.Sprintf("snippet%d.go", i))
		if err := os.WriteFile(src, []byte(s.source()), 0o600); err != nil {
			t.Fatal(err)
		}
		rel := fmt.Sprintf("internal/readme/snippet%d", i)
		overlay["Replace"][filepath.Join(root, rel, "snippet.go")] = src
		pkgs = append(pkgs, "./"+rel)
	}
	js, err := json.Marshal(overlay)
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, js, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool, append([]string{"build", "-overlay=" + ov}, pkgs...)...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("the Go snippets of the docs do not build (%v):\n%s", err, out.String())
	}
}
