// Package dsn reads PostgreSQL connection strings without a PostgreSQL
// client: it checks their form and hides their passwords, for package
// pgstore, which connects, and for the packages above it that name a store
// in messages and configuration (portalloc's Config) without linking pgx.
package dsn

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Check refuses a string that is neither form before it can reach the
// server: pgx takes any string that is not a postgres:// or postgresql://
// URL for key=value settings and sends the settings it does not know to
// the server, which echoes them in its error.

// Redacted is what Redact puts in place of a password.
const Redacted = "xxxxx"

// The URL schemes a DSN may have, in lower case as libpq and pgx take them.
const (
	schemePostgres   = "postgres://"
	schemePostgreSQL = "postgresql://"
)

// Forms says which forms of a DSN pgstore.Open takes, for messages.
const Forms = `a postgres:// or postgresql:// URL (the scheme in lower case, as libpq takes it) or key=value settings such as "host=/run/postgresql dbname=berth"`

// Check reports whether pgstore.Open takes dsn: a postgres:// or postgresql://
// URL (the scheme in lower case, as libpq and pgx take it) or key=value
// settings whose keys are words ("host=/run/postgresql dbname=berth"). A
// string that is neither, such as "POSTGRES://u:pw@h/db", is refused, with
// an error that says why and never quotes the string.
func Check(dsn string) error {
	if strings.HasPrefix(dsn, schemePostgres) || strings.HasPrefix(dsn, schemePostgreSQL) {
		return nil
	}
	if i := strings.Index(dsn, "://"); i >= 0 && urlLike(dsn[:i]) {
		scheme := dsn[:i]
		switch {
		case !isWord(scheme):
			return &Error{Reason: "it looks like a URL, with no scheme berth takes"}
		case strings.EqualFold(scheme, "postgres"), strings.EqualFold(scheme, "postgresql"):
			return &Error{Reason: fmt.Sprintf("its scheme %q must be in lower case, %q or %q, as libpq takes it", scheme+"://", schemePostgres, schemePostgreSQL)}
		}
		return &Error{Reason: fmt.Sprintf("its scheme %q is not %q or %q", scheme+"://", schemePostgres, schemePostgreSQL)}
	}
	pairs, ok := keywordValues(dsn)
	if !ok || len(pairs) == 0 {
		return &Error{Reason: "it is neither a URL nor key=value settings"}
	}
	for i, p := range pairs {
		if !isWord(p.key) {
			// The name is not quoted: it may be part of a password.
			return &Error{Reason: fmt.Sprintf("the name of its setting %d is not a word (letters, digits and _)", i+1)}
		}
	}
	return nil
}

// Error reports a DSN that pgstore.Open refuses before connecting (see
// Check): Reason says why. Its message never quotes the DSN, which may
// hold a password.
type Error struct {
	Reason string
}

func (e *Error) Error() string {
	return "not a PostgreSQL connection string: " + e.Reason + "; want " + Forms
}

// FromStore returns the pgx connection string that a store's name s (a
// Config.StoreDSN of portalloc, BERTH_STORE, berth --store) stands for: s
// itself when Check takes it, else, for an absolute path, the unix socket
// in that directory. Anything else is Check's error.
func FromStore(s string) (string, error) {
	err := Check(s)
	switch {
	case err == nil:
		return s, nil
	case filepath.IsAbs(s):
		// The socket directory, quoted as libpq quotes a value.
		return "host='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'", nil
	}
	return "", err
}

// urlLike reports whether s, what precedes "://", can be a URL's scheme.
func urlLike(s string) bool { return !strings.ContainsAny(s, " \t\n\r\v\f='") }

// isWord reports whether s is a keyword as libpq names its settings: ASCII
// letters, digits and underscores, not starting with a digit.
func isWord(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// secretKey reports whether a setting named key holds a secret: any name
// with "pass", "pwd" or "secret" in it.
func secretKey(key string) bool {
	k := strings.ToLower(key)
	return strings.Contains(k, "pass") || strings.Contains(k, "pwd") || strings.Contains(k, "secret")
}

// pair is one setting of a key=value string, and where its value's text
// (quotes included) starts and ends.
type pair struct {
	key, value string
	start, end int
}

// keywordValues splits a key=value string as libpq does: a key, "=" with
// optional spaces around it, and a value, a run of non-space characters
// or quoted in single quotes, backslash escaping the next character. ok is
// false when s does not parse so, with the pairs read until then.
func keywordValues(s string) (pairs []pair, ok bool) {
	isSpace := func(c byte) bool { return strings.IndexByte(" \t\n\r\v\f", c) >= 0 }
	i := 0
	for {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) {
			return pairs, true
		}
		k := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[k:i]
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) || s[i] != '=' || key == "" {
			return pairs, false
		}
		i++
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		start := i
		var val strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					val.WriteByte(s[i+1])
					i += 2
					continue
				}
				i++
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				pairs = append(pairs, pair{key, val.String(), start, i})
				return pairs, false
			}
		} else {
			for i < len(s) && !isSpace(s[i]) {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				val.WriteByte(s[i])
				i++
			}
		}
		pairs = append(pairs, pair{key, val.String(), start, i})
	}
}

// Redact returns dsn with every password in it replaced by Redacted, for
// messages and logs: the password of a URL's user information (one or
// several hosts), and the values of password and sslpassword query
// parameters or key=value settings (quoted or not), and of names that
// look like a misspelt password ("passwd", "pwd"). A string of neither
// form is hidden the same way as far as it can be read.
func Redact(dsn string) string {
	if i := strings.Index(dsn, "://"); i >= 0 && urlLike(dsn[:i]) {
		return redactSpans(dsn, urlSecrets(dsn, i+len("://")))
	}
	pairs, ok := keywordValues(dsn)
	var spans []span
	for _, p := range pairs {
		if secretKey(p.key) && p.end > p.start {
			spans = append(spans, span{start: p.start, end: p.end})
		}
	}
	out := redactSpans(dsn, spans)
	if ok {
		return out
	}
	// What keywordValues could not read (a string it gave up on): any
	// password setting, and what looks like user information.
	out = passwordPair.ReplaceAllStringFunc(out, func(m string) string {
		k, _, _ := strings.Cut(m, "=")
		return k + "=" + Redacted
	})
	return userInfo.ReplaceAllString(out, ":"+Redacted+"@")
}

// span is where a secret's text starts and ends in a DSN; query: it is a
// URL's query parameter, else a URL's password or a key=value setting.
type span struct {
	start, end int
	query      bool
}

// redactSpans returns dsn with spans, in order, replaced by Redacted.
func redactSpans(dsn string, spans []span) string {
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(dsn[last:sp.start])
		b.WriteString(Redacted)
		last = sp.end
	}
	b.WriteString(dsn[last:])
	return b.String()
}

// urlSecrets returns where the secrets of the URL dsn are, whose authority
// starts at rest. It reads the URL itself: net/url refuses several hosts.
func urlSecrets(dsn string, rest int) []span {
	end := len(dsn)
	if j := strings.IndexAny(dsn[rest:], "/?#"); j >= 0 {
		end = rest + j
	}
	var out []span
	if at := strings.LastIndexByte(dsn[rest:end], '@'); at >= 0 {
		if c := strings.IndexByte(dsn[rest:rest+at], ':'); c >= 0 {
			out = append(out, span{start: rest + c + 1, end: rest + at})
		}
	}
	q := strings.IndexByte(dsn[end:], '?')
	if q < 0 {
		return out
	}
	pos := end + q + 1
	query, _, _ := strings.Cut(dsn[pos:], "#")
	for _, p := range strings.Split(query, "&") {
		k, _, ok := strings.Cut(p, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if ok && secretKey(k) {
			out = append(out, span{start: pos + strings.IndexByte(p, '=') + 1, end: pos + len(p), query: true})
		}
		pos += len(p) + 1
	}
	return out
}

// secrets returns what of dsn is secret, as written and as decoded: the
// passwords Redact hides, and PGPASSWORD, which pgx reads when dsn has
// none.
func secrets(dsn string) []string {
	var out []string
	add := func(s string) {
		if s != "" && s != Redacted {
			out = append(out, s)
		}
	}
	if i := strings.Index(dsn, "://"); i >= 0 && urlLike(dsn[:i]) {
		for _, sp := range urlSecrets(dsn, i+3) {
			v, unescape := dsn[sp.start:sp.end], url.PathUnescape
			if sp.query {
				unescape = url.QueryUnescape
			}
			add(v)
			if d, err := unescape(v); err == nil {
				add(d)
			}
		}
	} else {
		pairs, ok := keywordValues(dsn)
		for _, p := range pairs {
			if secretKey(p.key) {
				add(p.value)
				add(dsn[p.start:p.end])
			}
		}
		if !ok {
			for _, m := range passwordPair.FindAllStringSubmatch(dsn, -1) {
				add(m[2])
				add(strings.Trim(m[2], "'"))
			}
			for _, m := range userInfo.FindAllStringSubmatch(dsn, -1) {
				add(m[1])
			}
		}
	}
	add(os.Getenv("PGPASSWORD"))
	return out
}

// Scrubber hides the secrets of one DSN in messages: the DSN itself, then
// each secret. Its zero value hides nothing.
type Scrubber struct {
	r *strings.Replacer
}

// NewScrubber returns a Scrubber of dsn's secrets and of more.
func NewScrubber(dsn string, more ...string) Scrubber {
	olds := append(secrets(dsn), more...)
	// Longest first: a secret that contains another is hidden whole.
	slices.SortFunc(olds, func(a, b string) int { return len(b) - len(a) })
	args := []string{}
	if dsn != "" {
		if red := Redact(dsn); red != dsn {
			args = append(args, dsn, red)
		}
	}
	for _, s := range olds {
		if s != "" {
			args = append(args, s, Redacted)
		}
	}
	if len(args) == 0 {
		return Scrubber{}
	}
	return Scrubber{strings.NewReplacer(args...)}
}

// String hides the secrets in s.
func (sc Scrubber) String(s string) string {
	if sc.r == nil {
		return s
	}
	return sc.r.Replace(s)
}

// Err returns err with the secrets hidden in its message; errors.Is and
// errors.As see err's chain as before. nil stays nil.
func (sc Scrubber) Err(err error) error {
	if err == nil || sc.r == nil {
		return err
	}
	msg := err.Error()
	clean := sc.r.Replace(msg)
	if clean == msg {
		return err
	}
	return &scrubbedError{msg: clean, err: err}
}

// scrubbedError is an error whose message had a secret hidden.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// passwordPair finds the key and value of password settings Redact's
// parser could not read.
var passwordPair = regexp.MustCompile(`(?i)(\w*(?:pass|pwd|secret)\w*)\s*=\s*('(?:\\.|[^'])*'|\S+)`)

// userInfo finds what looks like the password of user information
// ("u:pw@h") in a string that is no URL berth takes.
var userInfo = regexp.MustCompile(`:([^:@/\s]+)@`)
