package readme

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// prose returns the text of a markdown document outside its fenced code
// blocks and with its code spans removed, so that neither a pasted output
// nor `[x](y)` in backquotes is taken for a link; and the document's
// headings, in order.
func prose(doc string) (text string, headings []string) {
	var b strings.Builder
	fence := ""
	for line := range strings.Lines(doc) {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, "`~") == "" {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if h, ok := heading(line); ok {
			headings = append(headings, h)
		}
		b.WriteString(line)
	}
	return codeSpan.ReplaceAllString(b.String(), ""), headings
}

// heading returns the text of an ATX heading line ("## Text").
func heading(line string) (string, bool) {
	line = strings.TrimRight(line, "\r\n")
	level := len(line) - len(strings.TrimLeft(line, "#"))
	if level < 1 || level > 6 || len(line) == level || line[level] != ' ' {
		return "", false
	}
	return strings.TrimSpace(line[level:]), true
}

// codeSpan is a code span, which may run over a line break.
var codeSpan = regexp.MustCompile("(?s)`[^`]+`")

// link is an inline markdown link, [text](target) or [text](target "title").
var link = regexp.MustCompile(`\[[^\]]*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)

// linkText is a link within a heading, whose text alone makes the anchor.
var linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// anchor returns the fragment GitHub gives a heading: its text without
// markup, in lower case, with spaces as hyphens and every character other
// than a letter, a digit, '-' and '_' left out.
func anchor(h string) string {
	h = linkText.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the fragments of a document's headings; a repeated one
// gets -1, -2 and so on, as on GitHub.
func anchors(headings []string) []string {
	seen := map[string]int{}
	var out []string
	for _, h := range headings {
		a := anchor(h)
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// links returns the relative link targets of a document's prose: not
// those with a scheme (https:, mailto:), nor those that start with '/'.
func links(text string) []string {
	var out []string
	for _, m := range link.FindAllStringSubmatch(text, -1) {
		target := m[1]
		if strings.HasPrefix(target, "/") || strings.Contains(strings.SplitN(target, "#", 2)[0], ":") {
			continue
		}
		out = append(out, target)
	}
	return out
}

// brokenLinks checks the relative links of the markdown file rel under
// root: each must name a file or directory that exists and, with a
// #fragment, a markdown file with a heading of that anchor ("#x" alone is
// a heading of rel itself). It returns one line per broken link.
func brokenLinks(root, rel string) ([]string, error) {
	doc, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	text, _ := prose(string(doc))
	var broken []string
	for _, target := range links(text) {
		path, frag, _ := strings.Cut(target, "#")
		file := rel
		if path != "" {
			file = filepath.Join(filepath.Dir(rel), filepath.FromSlash(path))
		}
		if rootRel, err := filepath.Rel(root, filepath.Join(root, file)); err != nil || strings.HasPrefix(rootRel, "..") {
			broken = append(broken, fmt.Sprintf("%s: %s: leads out of the module", rel, target))
			continue
		}
		if _, err := os.Stat(filepath.Join(root, file)); err != nil {
			broken = append(broken, fmt.Sprintf("%s: %s: no such file: %v", rel, target, err))
			continue
		}
		if frag == "" {
			continue
		}
		if !strings.HasSuffix(file, ".md") {
			broken = append(broken, fmt.Sprintf("%s: %s: a #fragment of a file that is not markdown", rel, target))
			continue
		}
		to, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		_, hs := prose(string(to))
		if !slices.Contains(anchors(hs), frag) {
			broken = append(broken, fmt.Sprintf("%s: %s: %s has no heading with the anchor %q", rel, target, filepath.ToSlash(file), frag))
		}
	}
	return broken, nil
}

// TestLinks checks every relative link of README.md, CONTRIBUTING.md and
// docs/*.md: a reader who follows one lands on a file, and on a heading.
func TestLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range docs(t, root) {
		broken, err := brokenLinks(root, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range broken {
			t.Error(b)
		}
	}
}

func TestAnchor(t *testing.T) {
	for _, tt := range []struct{ heading, want string }{
		{"Why", "why"},
		{"The state directory: state, not cache", "the-state-directory-state-not-cache"},
		{"Fleet mode: one PostgreSQL store for many hosts", "fleet-mode-one-postgresql-store-for-many-hosts"},
		{"What berth refuses, and what it survives", "what-berth-refuses-and-what-it-survives"},
		{"`berth doctor`", "berth-doctor"},
		{"Ports in scripts, Makefiles and compose", "ports-in-scripts-makefiles-and-compose"},
		{"See [the guide](docs/x.md) too", "see-the-guide-too"},
		{"snake_case and dash-case", "snake_case-and-dash-case"},
		{"Größe ändern", "größe-ändern"},
	} {
		if got := anchor(tt.heading); got != tt.want {
			t.Errorf("anchor(%q) = %q; want %q", tt.heading, got, tt.want)
		}
	}
	if got, want := anchors([]string{"Usage", "Usage", "Other", "Usage"}), []string{"usage", "usage-1", "other", "usage-2"}; !slices.Equal(got, want) {
		t.Errorf("anchors of repeated headings = %q; want %q", got, want)
	}
}

func TestProseAndLinks(t *testing.T) {
	doc := "# Title\n\nSee [a](a.md), [b](b.md#x \"title\") and [web](https://example.com/#y).\n" +
		"Not `[code](c.md)`, nor a span over a line break: `one\n[two](d.md)`.\n\n" +
		"```sh\n# not a heading\n[e](e.md)\n```\n\n## Next [step](f.md)\n\n[g](#next-step) [h](/abs.md) [i](mailto:x@y)\n"
	text, hs := prose(doc)
	if got, want := hs, []string{"Title", "Next [step](f.md)"}; !slices.Equal(got, want) {
		t.Errorf("headings = %q; want %q", got, want)
	}
	if got, want := links(text), []string{"a.md", "b.md#x", "f.md", "#next-step"}; !slices.Equal(got, want) {
		t.Errorf("links = %q; want %q", got, want)
	}
}

// TestBrokenLinks checks that the check finds what it must, on a tree of
// its own: a missing file, a missing heading, a fragment of a file that is
// not markdown and a path out of the tree, and lets the good links pass.
func TestBrokenLinks(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("main.go", "package main\n")
	write("README.md", "# Top\n\n## The `store`: files\n\n[guide](docs/g.md#usage) [self](#the-store-files) [code](main.go) [dir](docs)\n"+
		"[gone](docs/gone.md) [nohead](docs/g.md#nope) [frag](main.go#L1) [out](../x.md)\n")
	write("docs/g.md", "# Guide\n\n## Usage\n\n[back](../README.md#top) [bad](../README.md#usage)\n")
	for _, tt := range []struct {
		file string
		want []string
	}{
		{"README.md", []string{"docs/gone.md", "docs/g.md#nope", "main.go#L1", "../x.md"}},
		{"docs/g.md", []string{"../README.md#usage"}},
	} {
		broken, err := brokenLinks(root, tt.file)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, b := range broken {
			// "FILE: TARGET: why"
			got = append(got, strings.SplitN(b, ": ", 3)[1])
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("brokenLinks(%s) = %q; want links %q", tt.file, broken, tt.want)
		}
	}
}

// TestTestCommand checks that the test command at the top of README.md is
// the one CI runs, byte for byte: .ci/run's go test lines each begin a line
// of the README's first ```sh block.
func TestTestCommand(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```sh\n")
	if !ok {
		t.Fatal("README.md has no ```sh block; want the two commands at its top")
	}
	block, _, _ := strings.Cut(rest, "```")
	var cmds int
	for line := range strings.Lines(string(ci)) {
		cmd := strings.TrimSpace(line)
		if !strings.HasPrefix(cmd, "go test ") {
			continue
		}
		cmds++
		found := false
		for l := range strings.Lines(block) {
			if l == cmd+"\n" || strings.HasPrefix(l, cmd+" ") {
				found = true
			}
		}
		if !found {
			t.Errorf(".ci/run runs %q, which does not begin a line of README.md's first sh block:\n%s", cmd, block)
		}
	}
	if cmds == 0 {
		t.Error(".ci/run runs no go test; want the README's test command")
	}
}
