package pgstore

import (
	"errors"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/store"
)

// Connection strings. A DSN carries a password in several places: the
// user information of a URL (postgres://u:pw@h/db, also with several
// hosts, postgres://u:pw@h1,h2/db), a password or sslpassword query
// parameter of a URL, or a password or sslpassword setting of a key=value
// string (quoted or not, with spaces around "=" or in the value). Redact
// hides each of them, and CheckDSN refuses a string that is neither form
// before it can reach the server: pgx takes any string that is not a
// postgres:// or postgresql:// URL for key=value settings and sends the
// settings it does not know to the server, which echoes them in its error.
//
// The reading of connection strings lives in a package of its own, which
// links no PostgreSQL client, so that portalloc hides the password of a
// Config.StoreDSN in the same way without linking pgx.

// Redacted is what Redact puts in place of a password.
const Redacted = dsn.Redacted

// DSNForms says which forms of a DSN Open takes, for messages.
const DSNForms = dsn.Forms

// CheckDSN reports whether Open takes dsn: a postgres:// or postgresql://
// URL (the scheme in lower case, as libpq and pgx take it) or key=value
// settings whose keys are words ("host=/run/postgresql dbname=berth"). A
// string that is neither, such as "postgre://u:pw@h/db" or
// "POSTGRES://u:pw@h/db", is refused with a *DSNError that says why and
// never quotes the string (it may hold a password): pgx would take it for
// key=value settings and send it to the server as a setting.
func CheckDSN(s string) error {
	err := dsn.Check(s)
	var de *dsn.Error
	if errors.As(err, &de) {
		return &DSNError{Reason: de.Reason, redacted: Redact(s)}
	}
	return err
}

// DSNError reports a DSN that Open refuses before connecting (see
// CheckDSN): Reason says why. Its message never quotes the DSN, which may
// hold a password. It wraps a *store.FieldError for the field "dsn" (whose
// Value is the DSN with its passwords hidden, see Redact), so
// errors.As(err, &fe) and errors.Is(err, store.ErrInvalid) hold for it.
type DSNError struct {
	Reason string

	redacted string // the DSN as Redact shows it
}

func (e *DSNError) Error() string { return (&dsn.Error{Reason: e.Reason}).Error() }

// Unwrap returns the *store.FieldError of the refused DSN, which wraps
// store.ErrInvalid.
func (e *DSNError) Unwrap() error {
	return &store.FieldError{Field: "dsn", Value: e.redacted, Want: dsn.Forms + "; " + e.Reason}
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
func Redact(s string) string { return dsn.Redact(s) }

// ScrubError returns err with every password of dsn (see Redact) hidden
// in its message, wherever it appears; errors.Is and errors.As see the
// same chain as before. It is for errors of a program's own that may quote
// dsn, or that pgx or the server returned.
func ScrubError(s string, err error) error { return dsn.NewScrubber(s).Err(err) }
