package idemsqlite

import "time"

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// SkipMigrate stops New from applying the embedded schema migrations.
	// Set it when migrations are run separately (Migrate, or the idem CLI)
	// and the application should not run DDL at start-up. Defaults to
	// false: New migrates.
	SkipMigrate bool

	// Now is the store's clock: every lease deadline, creation and expiry
	// time is taken from it, and every expiry judged by it. SQLite runs on
	// one host, so every process sharing the file shares this clock.
	// Defaults to time.Now; tests inject a fake clock here.
	Now func() time.Time

	// DisableBatch turns group commit off: every Reserve, Complete,
	// Release, Escalate and Extend then runs as its own autocommit
	// statement. With batching on, calls that arrive while another is
	// being written queue up and the next batch writes them all in one
	// transaction (see the package documentation); a call that finds the
	// store idle runs alone, as without batching. The store URL parameter
	// batch=off sets it. Defaults to false: batching on.
	DisableBatch bool
}

// withDefaults returns c with its zero fields filled in.
func (c Config) withDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports a misconfiguration at construction time. No current
// combination of fields is invalid; new fields are checked here.
func (c Config) validate() error { return nil }
