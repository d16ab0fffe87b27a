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

// Connection strings. A DSN carries a password in several places: the
// user information of a URL (postgres://u:pw@h/db, also with several
// hosts, postgres://u:pw@h1,h2/db), a password or sslpassword query
// parameter of a URL, or a password or sslpassword setting of a key=value
// string (quoted or not, with spaces around "=" or in the value). Redact
// hides each of them, and Check refuses a string that is neither form
// before it can reach the server: pgx takes any string that is not a
// postgres:// or postgresql:// URL for key=value settings and sends the
// settings it does not know to the server, which echoes them in its error.

// Redacted is what Redact puts in place of a password.
const Redacted = "xxxxx"

// The URL schemes a DSN may have, exactly as libpq and pgx take them: in
// lower case.
const (
	schemePostgres   = "postgres://"
	schemePostgreSQL = "postgresql://"
)

// Forms says which forms of a DSN pgstore.Open takes, for messages.
const Forms = `a postgres:// or postgresql:// URL (the scheme in lower case, as libpq takes it) or key=value settings such as "host=/run/postgresql dbname=berth"`

// isURL reports whether dsn is a URL that pgx parses as one.
func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, schemePostgres) || strings.HasPrefix(dsn, schemePostgreSQL)
}

// Check reports whether pgstore.Open takes dsn: a postgres:// or postgresql://
// URL (the scheme in lower case, as libpq and pgx take it) or key=value
// settings whose keys are words ("host=/run/postgresql dbname=berth"). A
// string that is neither, such as "postgre://u:pw@h/db" or
// "POSTGRES://u:pw@h/db", is refused, with an error that says why and
// never quotes the string (it may hold a password): pgx would take it for
// key=value settings and send it to the server as a setting.
func Check(dsn string) error {
	if isURL(dsn) {
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
// hold a password. pgstore.DSNError carries the same Reason.
type Error struct {
	Reason string
}

func (e *Error) Error() string {
	return "not a PostgreSQL connection string: " + e.Reason + "; want " + Forms
}

// FromStore returns the pgx connection string that a store's name s (a
// Config.StoreDSN of portalloc, BERTH_STORE, berth --store) stands for: s
// itself when Check takes it, else, for the absolute path of a directory,
// the unix socket in it ("host='/run/postgresql'", the database named
// like the user). Anything else is Check's error.
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

// urlLike reports whether s, what precedes "://" in a DSN, can be a URL's
// scheme rather than part of a key=value string.
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

// secretKey reports whether a setting named key holds a secret: password
// and sslpassword, and, in case of a misspelt name, any name with "pass",
// "pwd" or "secret" in it.
func secretKey(key string) bool {
	k := strings.ToLower(key)
	return strings.Contains(k, "pass") || strings.Contains(k, "pwd") || strings.Contains(k, "secret")
}

// pair is one setting of a key=value string: its key and value, and where
// the value's text (quotes included) starts and ends in the string.
type pair struct {
	key, value string
	start, end int
}

// keywordValues splits a key=value string as libpq does: a key, "=" with
// optional spaces around it, and a value that is either a run of
// non-space characters or quoted in single quotes, backslash escaping
// the next character in both. ok is false when s does not parse so; the
// pairs read until then are returned all the same, for Redact.
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
// several hosts), the values of its password and sslpassword query
// parameters, and the values of the password and sslpassword settings of
// a key=value string, quoted or not. Settings and parameters whose names
// look like a misspelt password ("passwd", "pwd") are hidden too. A
// string of neither form, such as a URL with another scheme, is hidden
// the same way as far as it can be read: its user information, and any
// password setting in it.
func Redact(dsn string) string {
	if i := strings.Index(dsn, "://"); i >= 0 && urlLike(dsn[:i]) {
		return redactURL(dsn, i+len("://"))
	}
	pairs, ok := keywordValues(dsn)
	var b strings.Builder
	last := 0
	for _, p := range pairs {
		if secretKey(p.key) && p.end > p.start {
			b.WriteString(dsn[last:p.start])
			b.WriteString(Redacted)
			last = p.end
		}
	}
	b.WriteString(dsn[last:])
	out := b.String()
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

// redactURL hides the user information's password and the secret query
// parameters of the URL dsn, whose authority starts at rest. It reads the
// URL itself rather than with net/url, which refuses several hosts.
func redactURL(dsn string, rest int) string {
	end := len(dsn)
	if j := strings.IndexAny(dsn[rest:], "/?#"); j >= 0 {
		end = rest + j
	}
	var b strings.Builder
	b.WriteString(dsn[:rest])
	auth := dsn[rest:end]
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		user := auth[:at]
		if c := strings.IndexByte(user, ':'); c >= 0 {
			user = user[:c+1] + Redacted
		}
		auth = user + auth[at:]
	}
	b.WriteString(auth)
	tail := dsn[end:]
	q := strings.IndexByte(tail, '?')
	if q < 0 {
		b.WriteString(tail)
		return b.String()
	}
	b.WriteString(tail[:q+1])
	query, frag, hasFrag := strings.Cut(tail[q+1:], "#")
	params := strings.Split(query, "&")
	for i, p := range params {
		k, _, ok := strings.Cut(p, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if ok && secretKey(k) {
			params[i] = p[:strings.IndexByte(p, '=')+1] + Redacted
		}
	}
	b.WriteString(strings.Join(params, "&"))
	if hasFrag {
		b.WriteString("#" + frag)
	}
	return b.String()
}

// secrets returns what of dsn is secret, as written and as decoded: the
// passwords Redact hides, and PGPASSWORD, which pgx reads when dsn has
// none. An error that quotes any of them is scrubbed (see Scrubber).
func secrets(dsn string) []string {
	var out []string
	add := func(s string) {
		if s != "" && s != Redacted {
			out = append(out, s)
		}
	}
	if i := strings.Index(dsn, "://"); i >= 0 && urlLike(dsn[:i]) {
		rest := dsn[i+3:]
		end := len(rest)
		if j := strings.IndexAny(rest, "/?#"); j >= 0 {
			end = j
		}
		auth := rest[:end]
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			if _, pw, ok := strings.Cut(auth[:at], ":"); ok {
				add(pw)
				if d, err := url.PathUnescape(pw); err == nil {
					add(d)
				}
			}
		}
		if _, query, ok := strings.Cut(rest[end:], "?"); ok {
			query, _, _ = strings.Cut(query, "#")
			for _, p := range strings.Split(query, "&") {
				k, v, _ := strings.Cut(p, "=")
				if dk, err := url.QueryUnescape(k); err == nil {
					k = dk
				}
				if secretKey(k) {
					add(v)
					if d, err := url.QueryUnescape(v); err == nil {
						add(d)
					}
				}
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

// Scrubber hides the secrets of one DSN in messages: the DSN itself
// wherever it appears, then each secret. Its zero value hides nothing.
type Scrubber struct {
	r *strings.Replacer
}

// NewScrubber returns a Scrubber of dsn's secrets and of more (a password
// pgx found elsewhere, say).
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

// passwordPair finds password settings Redact's parser could not read:
// the key and the value.
var passwordPair = regexp.MustCompile(`(?i)(\w*(?:pass|pwd|secret)\w*)\s*=\s*('(?:\\.|[^'])*'|\S+)`)

// userInfo finds what looks like the password of user information
// ("u:pw@h") in a string that is no URL berth takes.
var userInfo = regexp.MustCompile(`:([^:@/\s]+)@`)
