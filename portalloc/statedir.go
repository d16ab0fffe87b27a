package portalloc

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"

	"github.com/berth-go/berth/store"
)

// stateNotCache is why the default is a state directory, for people.
const stateNotCache = "state, not cache, so cache cleaners leave it"

// place is a default directory, before the root rule, and how it was found.
type place struct {
	dir  string // absolute
	how  string // for people: "$XDG_STATE_HOME/berth", ...
	vars string // the variables that chose it, for the root rule's message
	// own is the directory root uses instead, relative to its home from
	// the password database, when dir lies in another user's tree.
	own string
}

// homeDir returns $HOME, which must be an absolute path.
func homeDir() (string, error) {
	h := os.Getenv("HOME")
	switch {
	case h == "":
		return "", errors.New("$HOME is not set")
	case !filepath.IsAbs(h):
		return "", fmt.Errorf("$HOME %q is not an absolute path", h)
	}
	return h, nil
}

// statePlace is the platform's state directory for berth: see
// Config.StateDir.
func statePlace() (place, error) {
	switch runtime.GOOS {
	case "windows":
		base := os.Getenv("LocalAppData")
		switch {
		case base == "":
			return place{}, errors.New("%LocalAppData% is not set")
		case !filepath.IsAbs(base):
			return place{}, fmt.Errorf("%%LocalAppData%% %q is not an absolute path", base)
		}
		return place{dir: filepath.Join(base, "berth"), how: `%LocalAppData%\berth`}, nil
	case "darwin", "ios":
		home, err := homeDir()
		if err != nil {
			return place{}, err
		}
		rel := filepath.Join("Library", "Application Support", "berth")
		return place{dir: filepath.Join(home, rel), how: "~/Library/Application Support/berth", vars: "HOME", own: rel}, nil
	}
	rel := filepath.Join(".local", "state", "berth")
	x := os.Getenv("XDG_STATE_HOME")
	if x != "" && filepath.IsAbs(x) {
		return place{dir: filepath.Join(x, "berth"), how: "$XDG_STATE_HOME/berth", vars: "XDG_STATE_HOME", own: rel}, nil
	}
	home, err := homeDir()
	if err != nil {
		return place{}, err
	}
	how := "$XDG_STATE_HOME unset, so ~/.local/state/berth"
	if x != "" {
		// The XDG base directory specification: "If an implementation
		// encounters a relative path in any of these variables it should
		// consider the path invalid and ignore it."
		how = fmt.Sprintf("$XDG_STATE_HOME %q is relative, which the XDG base directory spec says to ignore, so ~/.local/state/berth", x)
	}
	return place{dir: filepath.Join(home, rel), how: how, vars: "HOME", own: rel}, nil
}

// resolved is a default directory with the root rule applied.
type resolved struct {
	dir    string
	reason string // for people: how it was chosen, without stateNotCache
	rooted string // non-empty when root uses its own directory: why, to log
}

// forRoot applies the root rule of Config.StateDir to p: a root process
// never takes a directory in another user's tree, but its own home's from
// the password database, and refuses with ErrUnsafe when it cannot have it.
func forRoot(p place) (resolved, error) {
	r := resolved{dir: p.dir, reason: "the default: " + p.how}
	if geteuid() != 0 || p.own == "" {
		return r, nil
	}
	uid, foreign := foreignOwner(p.dir)
	if !foreign {
		return r, nil
	}
	refuse := func(reason string) (resolved, error) {
		return resolved{}, fmt.Errorf("%w: running as root, the default state directory %s is in a directory of uid %d (%s is another user's, as sudo keeps it), and berth never creates root's files there; %s: set %s or Config.StateDir to a directory of root's",
			store.ErrUnsafe, p.dir, uid, p.vars, reason, envStateDir)
	}
	root, err := lookupRoot()
	if err != nil || root.HomeDir == "" || !filepath.IsAbs(root.HomeDir) {
		return refuse(fmt.Sprintf("root's home directory cannot be read from the password database (%v)", err))
	}
	own := filepath.Join(root.HomeDir, p.own)
	if ouid, foreign := foreignOwner(own); foreign {
		return refuse(fmt.Sprintf("root's own %s is in a directory of uid %d too", own, ouid))
	}
	return resolved{
		dir:    own,
		reason: fmt.Sprintf("the default for root: %s is another user's (uid %d; sudo keeps it), so root's own ~root/%s", p.vars, uid, filepath.ToSlash(p.own)),
		rooted: fmt.Sprintf("running as root with another user's %s (%s, uid %d; sudo keeps it); using root's own state directory instead", p.vars, p.dir, uid),
	}, nil
}

// defaultState is defaultStateDir with how it was chosen.
func defaultState() (resolved, error) {
	p, err := statePlace()
	if err != nil {
		return resolved{}, fmt.Errorf("%w: no default state directory (%w); set %s or Config.StateDir", store.ErrUnavailable, err, envStateDir)
	}
	return forRoot(p)
}

// Inject the process's identity and the password database, for tests.
var (
	geteuid    = os.Geteuid
	lookupRoot = func() (*user.User, error) { return user.LookupId("0") }
)

// DefaultStateDir returns the state directory of a Config that names none
// (and BERTH_STATE_DIR unset), and why it is that one, for people: see
// Config.StateDir. Without one (no HOME, say) it returns an error wrapping
// store.ErrUnavailable that says what to set.
func DefaultStateDir() (dir, reason string, err error) {
	r, err := defaultState()
	if err != nil {
		return "", "", opError("", err)
	}
	return r.dir, r.reason + "; " + stateNotCache, nil
}
