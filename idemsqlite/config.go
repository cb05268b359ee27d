package idemsqlite

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// SkipMigrate stops New from applying the embedded schema migrations.
	// Set it when migrations are run separately (Migrate, or the idem CLI)
	// and the application should not run DDL at start-up. Defaults to
	// false: New migrates.
	SkipMigrate bool
}

// withDefaults returns c with its zero fields filled in. Every current
// field's zero value is its default; new fields with other defaults are
// filled here.
func (c Config) withDefaults() Config { return c }

// validate reports a misconfiguration at construction time. No current
// combination of fields is invalid; new fields are checked here.
func (c Config) validate() error { return nil }
