package idemadmin

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
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
	// session ends then, or at sign-out, whichever comes first. Every
	// instance that has the same token under the same name accepts the
	// session. Defaults to 8h.
	SessionTTL time.Duration

	// MaxSessions is ignored.
	//
	// Deprecated: sessions are signed cookies that every instance sharing
	// the token file accepts, and are kept nowhere; signing out revokes
	// one in the store (see SessionScope).
	MaxSessions int

	// RefreshEvery is how often the review page, with script on,
	// refreshes its lists and counts. Defaults to 10s.
	RefreshEvery time.Duration

	// SignInFailures is how many failed sign-ins (a wrong token on the
	// page's form or in the API's Authorization header) a client address
	// may make in a row; it then regains one try every SignInRegain, and
	// is refused (429, Retry-After) until it does. Counted in this
	// process's memory. Defaults to 10.
	SignInFailures int

	// SignInRegain is how often an address regains one failed sign-in
	// (see SignInFailures). Defaults to 1m.
	SignInRegain time.Duration

	// SignInIPv6Prefix is the length, in bits, of the IPv6 networks
	// failed sign-ins are counted by: every address of one network shares
	// one count, as one host or site usually holds the whole network and
	// can pick any address in it. An IPv4 address (or an IPv4-mapped IPv6
	// one) counts alone. Between 32 and 128. Defaults to 64.
	SignInIPv6Prefix int

	// TrustedProxies are the load balancers in front of the admin
	// listener: for a request from one of them, failed sign-ins are
	// counted by the nearest address of X-Forwarded-For that is not one of
	// them, instead of by the balancer's own. Defaults to none: every
	// request counts by its peer's address.
	TrustedProxies []netip.Prefix

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
	if c.RefreshEvery == 0 {
		c.RefreshEvery = 10 * time.Second
	}
	if c.SignInFailures == 0 {
		c.SignInFailures = 10
	}
	if c.SignInRegain == 0 {
		c.SignInRegain = time.Minute
	}
	if c.SignInIPv6Prefix == 0 {
		c.SignInIPv6Prefix = 64
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
	if err := checkTokens(c.Tokens); err != nil {
		return err
	}
	switch {
	case c.Retention < time.Second:
		return fmt.Errorf("idemadmin: Config.Retention %v is under a second", c.Retention)
	case c.SessionTTL < time.Minute:
		return fmt.Errorf("idemadmin: Config.SessionTTL %v is under a minute", c.SessionTTL)
	case c.RefreshEvery < time.Second:
		return fmt.Errorf("idemadmin: Config.RefreshEvery %v is under a second", c.RefreshEvery)
	case c.SignInFailures < 1:
		return fmt.Errorf("idemadmin: Config.SignInFailures %d must be positive", c.SignInFailures)
	case c.SignInRegain < time.Second:
		return fmt.Errorf("idemadmin: Config.SignInRegain %v is under a second", c.SignInRegain)
	case c.SignInIPv6Prefix < 32 || c.SignInIPv6Prefix > 128:
		return fmt.Errorf("idemadmin: Config.SignInIPv6Prefix %d must be between 32 and 128 (bits of an IPv6 network)", c.SignInIPv6Prefix)
	}
	return nil
}

// checkTokens checks admin tokens as Config.Tokens and SetTokens take
// them.
func checkTokens(tokens map[string]string) error {
	if len(tokens) == 0 {
		return errors.New("idemadmin: Config.Tokens needs at least one admin token")
	}
	for name, tok := range tokens {
		if !validName(name) {
			return fmt.Errorf("idemadmin: token name %q must be letters, digits and ._@- (at most 64)", name)
		}
		if err := checkToken(tok); err != nil {
			return fmt.Errorf("idemadmin: token %q: %w", name, err)
		}
	}
	if err := unambiguous(tokens); err != nil {
		return fmt.Errorf("idemadmin: %w", err)
	}
	return nil
}
