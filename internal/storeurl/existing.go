package storeurl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ErrNoStore is returned by CheckExisting for a store that does not exist.
var ErrNoStore = errors.New("no such store")

// CheckExisting reports whether the store t names exists already, for
// tools that read or settle keys and must never create an empty store by
// mistake: a SQLite file that is not there (the wrong folder, a typo) is
// an error that names it, and so is memory://, which lives only inside the
// process that uses it. Server stores (PostgreSQL, MySQL, Redis) pass.
func (t *Target) CheckExisting() error {
	switch t.Kind {
	case KindMemory:
		return fmt.Errorf("%w: a memory:// store lives only inside the idem serve process that uses it; ask that process with --admin-url", ErrNoStore)
	case KindSQLite:
		st, err := os.Stat(t.sqlitePath)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			abs := t.sqlitePath
			if wd, err := os.Getwd(); err == nil && abs != "" && abs[0] != '/' {
				abs = wd + "/" + abs
			}
			return fmt.Errorf("%w: the SQLite file %s does not exist (run from the proxy's folder, give its absolute path as sqlite:///path/idem.db, or use --admin-url)", ErrNoStore, abs)
		case err != nil:
			return fmt.Errorf("store %s: %w", t.Redacted, err)
		case st.IsDir():
			return fmt.Errorf("%w: %s is a directory, not a SQLite file", ErrNoStore, t.sqlitePath)
		}
	}
	return nil
}
