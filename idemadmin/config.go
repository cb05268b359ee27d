package idemadmin

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Config configures the admin Handler.
type Config struct {
	// Store holds the keys the handler shows and settles. Required.
	Store idemstore.Store

	// Tokens maps each admin token's name to the token (see ParseTokens).
	// A request acts under the name of the token it presents, and every
	// change records that name. Required: at least one.
	Tokens map[string]string

	// Retention is how long an answer stored by a "complete" resolution
	// is kept. Defaults to 24h.
	Retention time.Duration

	// SessionTTL is how long a sign-in to the review page lasts; the
	// session ends then, or at sign-out, whichever comes first. Defaults
	// to 8h.
	SessionTTL time.Duration

	// MaxSessions bounds the review page's sessions, which live in this
	// process's memory; past it, the oldest is signed out. Defaults to
	// 1000.
	MaxSessions int

	// OnChange, if set, is called after every change made through the
	// handler (a resolution, a deletion).
	OnChange func(Result)

	// Logger receives the audit log of every change and every refused
	// sign-in. Defaults to slog.Default().
	Logger *slog.Logger

	// Now is the clock of sessions. Defaults to time.Now.
	Now func() time.Time

	// Sealer, if set, opens sealed answers and requests for display, and
	// seals the answers operators store (see Keys.Sealer): give it the
	// engine's. Defaults to nil.
	Sealer idemstore.Sealer
}

func (c Config) withDefaults() Config {
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = 8 * time.Hour
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 1000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	if c.Store == nil {
		return errors.New("idemadmin: Config.Store is required")
	}
	if len(c.Tokens) == 0 {
		return errors.New("idemadmin: Config.Tokens needs at least one admin token")
	}
	for name, tok := range c.Tokens {
		if !validName(name) {
			return fmt.Errorf("idemadmin: token name %q must be letters, digits and ._@- (at most 64)", name)
		}
		if err := checkToken(tok); err != nil {
			return fmt.Errorf("idemadmin: token %q: %w", name, err)
		}
	}
	if err := unambiguous(c.Tokens); err != nil {
		return fmt.Errorf("idemadmin: %w", err)
	}
	switch {
	case c.Retention < time.Second:
		return fmt.Errorf("idemadmin: Config.Retention %v is under a second", c.Retention)
	case c.SessionTTL < time.Minute:
		return fmt.Errorf("idemadmin: Config.SessionTTL %v is under a minute", c.SessionTTL)
	case c.MaxSessions < 1:
		return fmt.Errorf("idemadmin: Config.MaxSessions %d must be positive", c.MaxSessions)
	}
	return nil
}
