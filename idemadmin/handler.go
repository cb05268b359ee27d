package idemadmin

import (
	"html/template"
	"net/http"
	"sync/atomic"
)

// Handler serves the admin API (/api/v1/…, Bearer token) and the review
// page (/, a session cookie after signing in with a token). Mount it on
// the admin listener only: it settles keys.
type Handler struct {
	cfg     Config
	keys    *Keys
	auth    atomic.Pointer[authState]
	revoked *revocations
	limiter *signInLimiter
	actions *actionLog
	pages   map[string]*template.Template
	root    http.Handler
}

// authState is the admin tokens in force, and the keys that sign their
// sessions, by name.
type authState struct {
	tokens tokenSet
	keys   map[string][]byte
}

func newAuthState(tokens map[string]string) *authState {
	a := &authState{tokens: newTokenSet(tokens), keys: make(map[string][]byte, len(tokens))}
	for name, tok := range tokens {
		a.keys[name] = sessionKey(name, tok)
	}
	return a
}

// New returns the admin handler for cfg.
func New(cfg Config) (*Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &Handler{
		cfg:     cfg,
		revoked: newRevocations(cfg.Store, cfg.Now),
		limiter: newSignInLimiter(cfg.SignInFailures, cfg.SignInRegain),
		actions: newActionLog(recentActions),
	}
	h.keys = &Keys{Store: cfg.Store, Retention: cfg.Retention, Logger: cfg.Logger, Sealer: cfg.Sealer, OnChange: func(r Result) {
		h.actions.add(r, cfg.Now())
		if cfg.OnChange != nil {
			cfg.OnChange(r)
		}
	}}
	h.auth.Store(newAuthState(cfg.Tokens))
	var err error
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", h.apiRoutes())
	mux.Handle("/", h.pageRoutes())
	h.root = mux
	return h, nil
}

// SetTokens replaces the admin tokens, as a new token file says: the
// next request is authorized by them. The sessions of a token that was
// removed, or changed, end at once, here and on every instance given the
// same tokens; those of the others go on. Tokens are checked as
// Config.Tokens; on an error the running tokens stay.
func (h *Handler) SetTokens(tokens map[string]string) error {
	if err := checkTokens(tokens); err != nil {
		return err
	}
	h.auth.Store(newAuthState(tokens))
	return nil
}

// ServeHTTP serves the API and the review page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.root.ServeHTTP(w, r) }
